"""The format of a broker backup (``txmq broker backup``): the manifest file written last
in the backup directory, which the broker's restore reads.

    {"format": MANIFEST_FORMAT, "shard": ..., "replica": ..., "last_sequence": ...,
     "log_end": ..., "time_ms": ..., "files": {name: {"size": ..., "sha256": ...}}}
"""

#: The manifest's file name in a backup directory.
MANIFEST = "MANIFEST.json"
#: Its format version (a restore refuses one it does not know).
MANIFEST_FORMAT = 1

__all__ = ["MANIFEST", "MANIFEST_FORMAT"]
