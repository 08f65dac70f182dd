"""The name server: a registry of brokers and checkers, topic routes, and the Admin API
that fans out to the brokers it knows."""
