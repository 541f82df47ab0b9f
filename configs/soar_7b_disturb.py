"""SOAR "w/ disturb" (seed 001, Table 5 "QA Stability in Corrupted Training" and Table 6 "Evidence Fabrication
in Corrupted Training"): configs/soar_7b.py trained with a share of each search's passages replaced by passages
retrieved for another training question (retrieval/disturb.py); evaluation searches undisturbed.

The paper names the setting but gives neither what is corrupted nor how much. Our reading: the retrieved
passages (Table 6 disturbs Search-R1 and AutoRefine too, which have no internal stream), one in three of them
(rate 1/3: one of the top-3 passages of every search), drawn with disturb_seed.

    python launch/train.py --config configs/soar_7b_disturb.py \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct --config.judge.kind=openai \\
        --config.judge.base_url=http://127.0.0.1:8001 --config.judge.model=JUDGE
"""

from configs import soar_7b

DISTURB_RATE = 1 / 3  # our choice (the paper gives none): one of search_r1_7b's top-3 passages per search


def get_config():
    c = soar_7b.get_config()
    c.retriever.disturb_rate = DISTURB_RATE
    c.retriever.disturb_seed = 0
    return c
