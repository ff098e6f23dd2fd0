// Starts Amazon's DynamoDB Local bound to one address (loopback by default).
//
// DynamoDB Local has no option for the listen address: it builds Jetty's Server(port),
// which listens on every interface. This launcher builds the same server from the same
// command line, points its connector at -Ddynamodb.local.host before starting it, and
// exits when its standard input closes, so it never outlives the process that started it.
//
// Run in source-file mode (java 11+), with DynamoDBLocal.jar and DynamoDBLocal_lib/* on
// the class path and the same arguments as the jar: -inMemory -sharedDb -port P ...

import java.io.InputStream;
import java.lang.reflect.Field;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

public final class LoopbackDynamoDBLocal {
    private LoopbackDynamoDBLocal() {}

    public static void main(String[] args) throws Exception {
        String host = System.getProperty("dynamodb.local.host", "127.0.0.1");
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field serverField = DynamoDBProxyServer.class.getDeclaredField("server");
        serverField.setAccessible(true);
        Server server = (Server) serverField.get(proxy);
        for (Connector connector : server.getConnectors()) {
            ((ServerConnector) connector).setHost(host);
        }
        exitWhenStdinCloses();
        proxy.start();
        System.out.println("DynamoDB Local listening on " + host);
        System.out.flush();
        proxy.join();
    }

    // The parent holds our stdin open; end of input means it is gone, even if it was
    // killed without a chance to stop us.
    private static void exitWhenStdinCloses() {
        Thread watcher = new Thread(() -> {
            try {
                InputStream in = System.in;
                while (in.read() != -1) {
                    // keep reading until the parent closes the pipe
                }
            } catch (Exception ignored) {
                // a broken pipe means the same as end of input
            }
            Runtime.getRuntime().halt(0);
        }, "parent-watcher");
        watcher.setDaemon(true);
        watcher.start();
    }
}
