from services.common.runtime import run_main

from .config import BrokerConfig
from .server import create_server

if __name__ == "__main__":
    run_main("broker", BrokerConfig, create_server)
