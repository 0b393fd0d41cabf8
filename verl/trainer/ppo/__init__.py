"""PPO-family RL: the trainer loop (``ray_trainer``) and the algorithm maths (``core_algos`` and its family modules).

Importing this package has no side effects; ``core_algos`` registers the built-in advantage estimators and policy
losses when it is imported.
"""
