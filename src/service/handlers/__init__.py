"""The application's business handlers, one file per event type, each listed in ``service.registry``."""
