"""The checker: CheckTransactionState streams to producer groups, claims of due checks
from every broker, and the reports that spend, refund or decide on the broker."""
