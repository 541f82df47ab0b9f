"""Search-R1 "w/ disturb", SOAR's baseline row (seed 001, Tables 5 and 6, "Corrupted Training"):
configs/search_r1_7b.py trained with the disturbance of configs/soar_7b_disturb.py (the same share and seed of
each search's passages replaced by passages for another training question; evaluation undisturbed).

    python launch/train.py --config configs/search_r1_7b_disturb.py --config.model.hf_path=/ckpt/Qwen2.5-7B
"""

from configs import search_r1_7b, soar_7b_disturb


def get_config():
    c = search_r1_7b.get_config()
    c.retriever.disturb_rate = soar_7b_disturb.DISTURB_RATE
    c.retriever.disturb_seed = 0
    return c
