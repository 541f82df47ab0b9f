"""Search-R1 (GRPO) in EKA's Graph-R1 setting: the "Search-R1" row of seed 000 Table 2 (§5.2: "Graph-R1
runs GRPO in their experiments"). Search-R1's loop, prompt, reward and retriever, trained and evaluated on one
of Graph-R1's six datasets at a time over that dataset's own chunk-based retrieval set (§5: "a smaller,
dataset-specific chunk-based retrieval set"), with the Graph-R1 setting's hyperparameters (appendix D.4:
Table 12 holds them for the Graph-R1 setting; configs/graphr1_7b.py carries them from EKA's run_grpo.sh).

What comes from where:
- the setting (Graph-R1's data splits, training hyperparameters, turn and length limits, sampling): from
  configs/graphr1_7b.py, unchanged, so that Table 2's Search-R1 and Graph-R1 rows differ in the method only;
- the method (the `<search>` / `<information>` loop and its prompt, the EM reward, E5 top-3 passages):
  Search-R1's (PeterGriffinJin/Search-R1). Neither EKA's code nor Graph-R1's has a script for this row, so
  these are the backbone's own (§5.1 "Retriever": "highly dependent on the backbone. In Search-R1, the
  retriever is E5").

The retrieval set is the dataset's corpus.jsonl (Graph-R1's layout; its contexts are shorter than the 1,200
tokens Graph-R1 chunks at, graphr1/graphr1.py chunk_token_size, so a context is a chunk), indexed with E5:

    python launch/build_index.py --corpus datasets/2WikiMultiHopQA/corpus.jsonl --retriever dense \\
        --encoder e5 --out indexes/e5/2WikiMultiHopQA
    python launch/serve_retriever.py --corpus datasets/2WikiMultiHopQA/corpus.jsonl --retriever dense \\
        --index indexes/e5/2WikiMultiHopQA --port 8002
    python launch/train.py --config configs/search_r1_graphr1_7b.py:2WikiMultiHopQA \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

Graph-R1's own run_grpo.sh trains 1 epoch where EKA's trains 3: `--config.total_epochs=1` for Graph-R1's.
"""

from configs import graphr1_7b


def get_config(dataset: str = "2WikiMultiHopQA"):
    """dataset: one of graphr1_7b.DATASETS (`--config configs/search_r1_graphr1_7b.py:HotpotQA`)."""
    # Graph-R1's data layout and splits, Qwen2.5-7B-Instruct (§5.1), run_grpo.sh's 128 questions x 5, lr
    # 5e-7, KL loss 0.001 (low_var_kl), 3 epochs, 10 turns (ppo_trainer.yaml tool.max_turns), 4096-token
    # responses and observations, top_p 1: each value cited in configs/graphr1_7b.py
    c = graphr1_7b.get_config(dataset)
    c.protocol.update(dict(name="search_r1", tags="search_r1"))
    # Search-R1's prompt (scripts/data_process/nq_search.py make_prefix; EKA's script_process.py keeps the
    # same text as make_prefix(template_type="base")), never a dataset row's: Graph-R1's processed parquet
    # carries Graph-R1's `<query>` instruction
    c.protocol.data_prompt = False
    # the dataset's chunk server (commands above); port 8001 stays the hypergraph's (graphr1_7b.py)
    c.retriever.update(dict(kind="remote", url="http://127.0.0.1:8002/retrieve", encoder="e5"))
    c.rollout.update(
        dict(
            retrieval_k=3,  # Search-R1 train_grpo.sh retriever.topk=3 (retrieval_launch.sh --topk 3)
            eval_retrieval_k=3,  # the same in validation (train_grpo.sh)
        )
    )
    # Search-R1's reward (verl/trainer/main_ppo.py: qa_em.compute_score_em, exact match of the last
    # <answer>); Graph-R1's needs its own `<query>` turns and rates any Search-R1 trace a format failure
    c.reward.terms = (("em", 1.0),)
    return c
