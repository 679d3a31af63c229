"""The Spark side: batch jobs that recompute broker state from the lake.

``lake`` is the one door to Delta; ``rules`` holds the Spark column forms of the RocketMQ rules;
``cli``, ``runs`` and ``extract`` are what the jobs share; each job is a module or a package of
its own, and ``nightly`` runs them all. See docs/architecture.md and docs/jobs.md.
"""

from __future__ import annotations
