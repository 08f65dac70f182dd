"""``python -m services.checker``: the checker process."""

from services.common.runtime import run_main

from .config import CheckerConfig
from .server import create_server

if __name__ == "__main__":
    run_main("checker", CheckerConfig, create_server)
