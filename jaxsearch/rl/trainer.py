"""The RL trainer, top to bottom: setup -> resume -> per step (rollout -> rewards -> update batches -> update
-> evaluate -> checkpoint -> log).

    train(config, workdir)      # config: a `config.RunConfig` (or a ConfigDict from configs/*.py)

Everything a step needs to be reproduced is derived from (config.seed, step) or restored from the last
checkpoint (params, optimizer state, step, data-iterator position), so a rerun after a crash continues
exactly where the last checkpoint left off. SIGTERM saves a checkpoint and exits (preemption). A run that
reaches `total_steps` also writes the final policy to `workdir/params` (`orbax_io.save_params`; LoRA: merged
into the base) and, with LoRA, its adapters in peft's format to `workdir/adapter` (`models/peft_io.py`).
"""

from __future__ import annotations

import functools
import logging
import os

import jax
from tqdm import tqdm

from jaxsearch import checkpoint, parallel
from jaxsearch.models import orbax_io, peft_io
from jaxsearch.agent.build import build_engine, for_evaluation, with_disturbance
from jaxsearch.config import RunConfig
from jaxsearch.data import qa
from jaxsearch.scoring.episodes import heldout_metrics, score_rollout
from jaxsearch.agent.policy import load_policy
from jaxsearch.scoring import judge as judge_lib
from jaxsearch.rl import dynamic_sampling
from jaxsearch.rl.algorithms import make_algorithm
from jaxsearch.rl.step_log import MetricWriter, StepTimer
from jaxsearch.retrieval.client import RetrieverUnavailable

log = logging.getLogger("jaxsearch.trainer")

ROLLOUT_STREAM, EVAL_STREAM, REFILL_STREAM = 0, 1, 2  # independent PRNG streams of the seed


def step_key(seed: int, stream: int, step: int) -> jax.Array:
    """The PRNG key of one step's rollout (or evaluation): fold_in(fold_in(key(seed), stream), step); row i
    then samples with fold_in(that, i), collision-free at any batch size."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), stream), step)


def eval_sets(d) -> dict:
    """config.data.eval: name -> the held-out examples (`eval_examples` of them, first or seeded random)."""
    return {
        name: qa.eval_subset(qa.load_examples(path), d.eval_examples, d.eval_sample, d.eval_seed)
        for name, path in d.eval.items()
    }


def resolve_total_steps(cfg: RunConfig, train_examples: int) -> RunConfig:
    """cfg with total_steps = total_epochs x (train_examples // batch_size) when total_epochs > 0 (veRL's
    count: its loader drops the last partial batch), else unchanged."""
    if not cfg.total_epochs:
        return cfg
    per_epoch = train_examples // cfg.data.batch_size
    if per_epoch == 0:
        raise ValueError(
            f"data.train has {train_examples} questions, fewer than one batch of data.batch_size="
            f"{cfg.data.batch_size}: total_epochs={cfg.total_epochs} makes no step"
        )
    return cfg.replace(total_steps=cfg.total_epochs * per_epoch)


def train(cfg, workdir: str, progress: bool = True) -> dict:
    """Run (or resume) GRPO / PPO training; returns the last step's metrics.

    A retrieval server that stays down past config.retriever.deadline_s (retrieval/client.py) stops the run:
    RetrieverUnavailable, its message naming the newest checkpoint on disk, which the same command resumes
    from. Skipping the step's batch instead would silently change the data order a resume reproduces."""
    try:
        return _train(cfg, workdir, progress)
    except RetrieverUnavailable as e:
        directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []
        kept = f"step {steps[-1]} ({directory}/{steps[-1]})" if steps else "none yet (the run restarts from step 0)"
        raise RetrieverUnavailable(f"{e}\ntraining stopped; the newest checkpoint kept: {kept}; rerun the same "
                                   "command to resume from it") from e


def _train(cfg, workdir: str, progress: bool) -> dict:
    cfg = RunConfig.from_dict(cfg)
    d = cfg.data
    train_examples = qa.load_examples(d.train)
    cfg = resolve_total_steps(cfg, len(train_examples))
    # --- setup: the policy on the mesh, the agent, the rewards, the algorithm and its state
    os.makedirs(workdir, exist_ok=True)
    mesh = parallel.make_mesh(dict(cfg.mesh))
    config, params = load_policy(cfg.model, cfg.seed, mesh)
    engine = build_engine(cfg, config, mesh)
    eval_engine = for_evaluation(engine, cfg.rollout)  # the same agent, the evaluation's sampling
    # SOAR's "w/ disturb" (retriever.disturb_rate > 0): training rollouts only, donors the training questions
    engine = with_disturbance(engine, cfg.retriever, [e.question for e in train_examples])
    held_out, judge = eval_sets(cfg.data), judge_lib.chat_judge(cfg.judge)
    reward_fn = judge_lib.reward_fn_from_config(cfg)
    algo = make_algorithm(cfg, config, mesh)
    state = algo.init_state(params)
    del params  # donated to the first update

    def evaluate(step: int) -> dict:
        key = step_key(cfg.seed, EVAL_STREAM, step)
        params = algo.decode_params(state)
        return heldout_metrics(eval_engine, params, held_out, key, judge, cfg.protocol.data_prompt)

    # --- resume: state and data position from the last checkpoint, metrics after it forgotten
    iterator = qa.QAIterator(train_examples, d.batch_size, d.group_size, cfg.seed, d.shuffle)
    ckpt = checkpoint.TrainCheckpointer(workdir, save_every=cfg.save_every, max_to_keep=cfg.keep_checkpoints)
    start = 0
    restored = ckpt.restore_latest(state)
    if restored is not None:
        start, state, meta = restored
        iterator.restore(meta["iterator"])
    writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
    writer.drop_after(start)
    preempted = checkpoint.install_sigterm_handler()
    if start == 0 and held_out:
        writer.write(0, evaluate(0))

    def draw(timer, params, step: int, attempt: int):
        """The next questions rolled out and scored -> (traj, scores, metrics); attempt > 0 is dynamic sampling
        drawing again, its key on a stream of its own (row i of a rollout samples with fold_in(key, i))."""
        examples = next(iterator)
        key = step_key(cfg.seed, ROLLOUT_STREAM, step)
        if attempt:
            key = jax.random.fold_in(step_key(cfg.seed, REFILL_STREAM, step), attempt)
        with timer("rollout"):  # agent/engine.py
            traj = engine.rollout_examples(params, examples, key, cfg.protocol.data_prompt)
        with timer("reward"):  # scoring/episodes.py
            f1_rule = engine.protocol.f1_special_answers  # the protocol's F1: Graph-R1's has no yes/no rule
            scores, episode_metrics = score_rollout(reward_fn, traj, examples, f1_rule)
        return traj, scores, episode_metrics

    # --- the loop
    last, stop = {}, False
    name = "ppo" if algo.ppo else "grpo"
    bar = tqdm(range(start, cfg.total_steps), initial=start, total=cfg.total_steps, desc=name,
               disable=not progress or jax.process_index() != 0)  # fmt: skip
    for step in bar:
        timer, done = StepTimer(), step + 1
        with timer("rollout"):
            sample = functools.partial(draw, timer, algo.decode_params(state), step)
        if cfg.algo.dynamic_sampling:  # rl/dynamic_sampling.py: DAPO's drawing until groups differ in reward
            traj, scores, episode_metrics = dynamic_sampling.collect(sample, d.batch_size, d.group_size, cfg.algo.max_draws)  # fmt: skip
        else:
            traj, scores, episode_metrics = sample(0)
        position = iterator.state()
        state, metrics = algo.step(state, traj, scores, timer)  # rl/algorithms.py: old_logprobs ... update
        metrics.update(episode_metrics)
        metrics.update({f"time/rollout/{k}_s": v for k, v in traj.timings.items()})  # within time/rollout_s
        if cfg.eval_every and held_out and (done % cfg.eval_every == 0 or done == cfg.total_steps):
            with timer("evaluate"):  # scoring/episodes.py
                metrics.update(evaluate(done))
        with timer("checkpoint"):  # checkpoint.py
            stop = preempted()
            ckpt.save(done, state, {"iterator": position}, force=stop or done == cfg.total_steps)
        metrics.update(timer.metrics())  # rl/step_log.py
        metrics["tokens_per_s"] = float(traj.attention_mask.sum()) / metrics["time/step_s"]
        if done % cfg.log_every == 0 or done == cfg.total_steps:
            writer.write(done, metrics)
        bar.set_postfix(reward=f"{metrics['reward']:.3f}", em=f"{metrics['em']:.3f}")
        last = metrics
        if stop:
            log.warning("SIGTERM: saved step %d, exiting", done)
            break
    ckpt.wait()
    ckpt.close()
    if not stop:  # the final policy as a params dir: what launch/eval.py and convert_checkpoint.py read
        orbax_io.save_params(os.path.join(workdir, "params"), config, algo.final_params(state))
        if algo.lora is not None:
            adapter_dir = os.path.join(workdir, "adapter")
            peft_io.save_peft(adapter_dir, config, algo.lora, state["policy"].params, cfg.model.hf_path)
    return last
