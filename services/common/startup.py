"""Why a service could not start: the one error the runtime reports as a single line (no
traceback), raised by whatever the start-up reads (ports, directories, credentials)."""


class StartupError(Exception):
    """The environment keeps a service from starting (a port in use, a data directory that
    cannot be written...); the message is the one line the operator reads."""
