"""`dspark-targets plan`: what a config asks of the cluster and what its corpus will cost.

* `resources.py`: the Ray resources a config requests, in words;
* `inputs.py`: the planner's typed inputs (corpus, target, assumptions);
* `corpus_stats.py`: those inputs read from the config's corpus and target;
* `figures.py`: the measured defaults, each naming the bench that measured it and when, and GPU specs;
* `capacity.py`: the arithmetic (storage, objects, rates, time, training), pure;
* `planner.py`, `report.py`: gather, compute, show (table or JSON).

docs/cluster.md has every formula and the worked example of the 2.8T target.
"""

from pipeline.plan.resources import describe_resources

__all__ = ["describe_resources"]
