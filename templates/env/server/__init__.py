"""__env_name__'s server side: the environment and the app that serves it."""
