"""The RocketMQ 5 compatibility proxy: serves ``apache.rocketmq.v2.MessagingService`` for the
official RocketMQ clients (Java, Go, C++, C#, Python, Node.js, Rust) and translates it onto
txmq's native name server, brokers and checkers. Stateless between replicas: transaction ids
and receipt handles are self-describing, so any replica serves any request."""
