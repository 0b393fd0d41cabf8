"""Workers of the RL loop: actor/rollout/ref, critic, reward managers and their configs (upstream ``verl.workers``).

Importing this package imports nothing else; import the submodule you need.
"""
