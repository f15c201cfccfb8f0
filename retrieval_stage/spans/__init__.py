"""What the stage and the pipeline write on their spans.

- `keys`: every span attribute key and metric name of ours (beside OpenInference's);
- `content`: capping ids, texts and metadata in UTF-8 bytes; the RERANKER span's output value;
- `fit`: placing attributes under the SDK's attribute-count limit without evicting any;
- `genai`: OpenTelemetry's experimental GenAI names for a rerank, behind their opt-in;
- `reranker`: `RerankerSpans`, the writer that owns a RERANKER span from identity to outcome;
- `pipeline`: `PipelineSpans`, the CHAIN and RETRIEVER spans around it;
- `otel_private`: the spans' reads of OpenTelemetry state that has no public API.
"""

from .content import DEFAULT_MAX_CONTENT_BYTES, TRUNCATION_MARKER, cap_content, output_value
from .genai import GENAI_OPT_IN, STABILITY_OPT_IN_ENV, genai_opted_in
from .keys import (
    ATTR_BATCHES,
    ATTR_CANCELLED,
    ATTR_DOCUMENTS,
    ATTR_FALLBACK,
    ATTR_INPUT_OMITTED,
    ATTR_OUTPUT_OMITTED,
    ATTR_PROVIDER,
    ATTR_RECALL,
    ATTR_RECALL_K,
    ATTR_REQUESTS,
    ATTR_RETRIES,
    ATTR_RETRIEVAL_OMITTED,
    ATTR_TOP1_CHANGED,
    ATTR_USAGE_SEARCH_UNITS,
    ATTR_USAGE_TOTAL_TOKENS,
)
from .reranker import FALLBACK_STATUS_PREFIX, OUTPUT_CONTENT_ENV, RerankerSpan, RerankerSpans

__all__ = [
    "ATTR_BATCHES",
    "ATTR_CANCELLED",
    "ATTR_DOCUMENTS",
    "ATTR_FALLBACK",
    "ATTR_INPUT_OMITTED",
    "ATTR_OUTPUT_OMITTED",
    "ATTR_PROVIDER",
    "ATTR_RECALL",
    "ATTR_RECALL_K",
    "ATTR_REQUESTS",
    "ATTR_RETRIES",
    "ATTR_RETRIEVAL_OMITTED",
    "ATTR_TOP1_CHANGED",
    "ATTR_USAGE_SEARCH_UNITS",
    "ATTR_USAGE_TOTAL_TOKENS",
    "DEFAULT_MAX_CONTENT_BYTES",
    "FALLBACK_STATUS_PREFIX",
    "GENAI_OPT_IN",
    "OUTPUT_CONTENT_ENV",
    "STABILITY_OPT_IN_ENV",
    "TRUNCATION_MARKER",
    "RerankerSpan",
    "RerankerSpans",
    "cap_content",
    "genai_opted_in",
    "output_value",
]
