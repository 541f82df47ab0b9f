"""The agent engine: protocols, tag parsing, the KV-cache sampler and the multi-turn episode driver.

RL (`jaxsearch.rl`), evaluation (`jaxsearch.eval`) and serving all roll out through it.
"""
