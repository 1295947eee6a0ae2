"""The routers: what decides a query's distant keys. The paper's centroids (`centroids`, the tensor functions; `routing`,
one layer's call), the per-key indexer (`indexer`), the training-free peers (`selectors`) and the attention-recall
objective that trains a router against the frozen model (`recall`)."""
