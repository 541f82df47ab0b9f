"""SOAR "w/ disturb" (seed 001, Tables 5-6, "Corrupted Training") on the tiny world: configs/tiny_cpu_soar.py
with configs/soar_7b_disturb.py's share of retrieved passages replaced by passages for another training
question in the training rollouts (tiny_cpu retrieves 1 passage: one search in three, on average, gets a
donor's passage instead); held-out evaluation searches undisturbed.

    python launch/train.py --config configs/tiny_cpu_soar_disturb.py
"""

from configs import soar_7b_disturb, tiny_cpu_soar


def get_config():
    c = tiny_cpu_soar.get_config()
    c.retriever.disturb_rate = soar_7b_disturb.DISTURB_RATE
    c.retriever.disturb_seed = 0
    return c
