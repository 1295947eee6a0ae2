"""The kernels that compute a whole prompt: the two-call decomposition (`decomposed`, from `band` and `rectangle` over
`segments`), FlexAttention (`flex`) and the indexer's prompt (`indexer_prompt`), each taking one call as `call`
states it. The native C++ kernels sit beside them in `focus.attention.native`; the decoding steps with the cache they
read, in `focus.attention.cache`."""
