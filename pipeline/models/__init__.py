"""SQL models: ``models/*.sql`` files run on Spark over the Iceberg tables, written back
through pyiceberg (``icefloe models list|show|run``). See :mod:`pipeline.models.runner`."""

from pipeline.models.dag import Project, Ref, check_tables, plan_project, topological_order
from pipeline.models.runner import Outcome, last_runs, model_hash, prepare, run_models
from pipeline.models.spec import Model, ModelError, load_models, parse_model
from pipeline.models.state import RunState, last_run
from pipeline.models.write import WriteFence

__all__ = [
    "Model",
    "ModelError",
    "Outcome",
    "Project",
    "Ref",
    "RunState",
    "WriteFence",
    "check_tables",
    "last_run",
    "last_runs",
    "load_models",
    "model_hash",
    "parse_model",
    "plan_project",
    "prepare",
    "run_models",
    "topological_order",
]
