"""The training data, from chat records to the batches of each rank.

records       reading and checking chat records (pure Python)
encoding      records -> token ids and labels (the chat template, assistant masking), and the data sets
token_cache   tokenize once per node (or once overall), shared through files
batches       the data set through the cache, padded batches, and the seeded data order of every rank
"""
