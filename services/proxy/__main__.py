"""``python -m services.proxy``: the RocketMQ 5 compatibility proxy process."""

from services.common.runtime import run_main

from .config import ProxyConfig
from .server import create_server

if __name__ == "__main__":
    run_main("proxy", ProxyConfig, create_server)
