"""The maths and the orchestration both worker paths share (docs/design.md "Two worker paths, one core").

The legacy workers (``fsdp_workers`` + ``dp_actor``/``dp_critic``) and the engine workers call these modules;
neither re-implements them:

=====================  ===========================================================================================
``micro_batching``     mini-batches, micro-batches by count or by token budget (``use_dynamic_bsz``), global
                       token/sequence counts that make gradient accumulation exact
``model_forward``      packed (default) or padded model forward → response log-probs / entropy / values
``lm_head``            the LM head run only on the response window, optionally fused with the log-prob maths
``losses``             policy loss (``core_algos`` registry) + entropy bonus + KL loss; clipped value loss
``optimizer_step``     gradient clipping that skips non-finite steps; optimizer and lr-schedule construction
``fsdp_model``         HF model -> patches -> FSDP1/FSDP2 wrap -> optimizer, for every role
``batch_plan``         per-rank batch sizes (``BatchPlan``) and the forward switches of one call (``meta_info``)
``micro_forward``      the model forward of one micro-batch (policy / value), as both paths call it
``update_loop``        epochs × mini-batches × micro-batches → clipped step; the forward-only pass
``placement``          the offload rule of one model (parameters / optimizer state between phases)
``roles``              role parsing, typed role configs, ``generate_sequences``
``process_group``      ``torch.distributed`` start-up of a worker
``parallel_layout``    data parallel × Ulysses coordinates and groups
``routing``            which forwards record / replay the MoE routing
=====================  ===========================================================================================
"""
