"""kvtwin's Python package: the store behind vLLM's KV connector.

``kvtwin.connector.KvtwinConnector`` is the class vLLM loads
(``kv_connector_module_path="kvtwin.connector"``); ``kvtwin._native`` is the Rust
extension it drives (``Store``, ``block_identities``, ``journaled_blocks``).
"""

from kvtwin._native import Store, block_identities, journaled_blocks

__all__ = ["Store", "block_identities", "journaled_blocks"]
