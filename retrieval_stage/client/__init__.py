"""HTTP rerank clients: `RerankClient` (sync) and `AsyncRerankClient`.

Both map every result back to the caller's own item by the response's index (never by
position), validate every response, split batches above the server's cap, retry what is worth
retrying inside one deadline per call, and translate httpx errors into the `RerankError` tree.
All of that is decided once, in the sans-I/O flow (`flow`, `steps`) reading a frozen `plan`;
`sync` and `asynchronous` hold the two thin drivers that do its I/O. `providers` holds the wire
formats as data, `retry` the retry policy, `sanitize` the cleaning of server text and
`deadline_io` the sync socket caps.
"""

from .asynchronous import AsyncRerankClient
from .body import DEFAULT_MAX_RESPONSE_BYTES, read_body
from .deadline_io import DeadlineTransport
from .sync import RerankClient

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "AsyncRerankClient",
    "DeadlineTransport",
    "RerankClient",
    "read_body",
]
