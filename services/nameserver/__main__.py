"""``python -m services.nameserver``: the name server process."""

from services.common.runtime import run_main

from .config import NameServerConfig
from .server import create_server

if __name__ == "__main__":
    run_main("nameserver", NameServerConfig, create_server)
