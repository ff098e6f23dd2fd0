from local.cli import main

raise SystemExit(main())
