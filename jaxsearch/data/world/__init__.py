"""The synthetic multi-hop world: fictional facts no model can know, so the only way to answer is to search.

- `tables`: relations and their sentence / question templates, comparison templates, name parts.
- `generator`: `WorldConfig` / `world_config(size, seed)`, `generate_world`, `World` and `World.write`.
- `oracle`: rule-based stand-ins for models: `solution_trace` (ideal trajectories), `read_answer` (evidence
  reader), `WorldChatModel` (judge and evidence answerer, config `kind: world`).
"""
