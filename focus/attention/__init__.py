"""Focus attention: routing, the dense reference pattern, its fast paths (the two-call decomposition, sparse decoding
through `FocusCache`) and the attention function registered with transformers."""
