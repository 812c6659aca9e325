"""The training data, from chat records to the batches of each rank.

formats       the record formats users bring (Qwen, ShareGPT, OpenAI with tool calls, ms-swift, alpaca; TRL's,
              LLaMA-Factory's and ms-swift's preference pairs) -> OpenAI-style messages and tools (pure Python)
records       reading and checking chat records and preference pairs (pure Python)
sources       Parquet, Arrow, saved data sets, hub data sets, LLaMA-Factory's dataset_info.json; several mixed
encoding      records -> token ids and labels (the chat template, assistant masking), and the data sets
token_cache   tokenize once per node (or once overall), shared through files
batches       the data set through the cache, padded batches, and the seeded data order of every rank
pairs         preference pairs -> token ids and labels (the answers only), through the cache
"""
