"""MLflow, through its own ``MlflowClient`` (no global active run: the client is this run's alone).

Where: the tracking server or store of ``MLFLOW_TRACKING_URI`` when the user set it (MLflow reads its
own variable), else an SQLite store inside the run folder (``mlflow.db``; ``mlflow ui
--backend-store-uri sqlite:///RUN_DIR/mlflow.db`` shows it). The run's id is kept in the run folder, so
a restarted job logs into the same MLflow run. MLflow keeps every value it is given: the steps a
restarted run does again appear twice in its history (metrics.csv and TensorBoard have them once).
"""

from __future__ import annotations

import importlib.util
import os

from ..errors import RingtrainError
from .adapter import Adapter


class MLflow(Adapter):
    def __init__(self, folder: str, resume_step: int | None):
        from mlflow import MlflowClient

        if "MLFLOW_TRACKING_URI" in os.environ:
            self.client = MlflowClient()
        elif importlib.util.find_spec("sqlalchemy") is None:
            raise RingtrainError("log_with=['mlflow'] has no store: MLFLOW_TRACKING_URI is not set, and a local "
                                 "store needs SQLAlchemy (mlflow-skinny leaves it out)",
                                 "set MLFLOW_TRACKING_URI to your MLflow server (http://HOST:5000), or pip install "
                                 "mlflow for a store in the run folder.")
        else:
            self.client = MlflowClient(tracking_uri=f"sqlite:///{os.path.abspath(folder)}/mlflow.db")
        id_file = os.path.join(folder, "mlflow-run-id")
        if os.path.exists(id_file):
            with open(id_file) as f:
                self.run_id = f.read().strip()
        else:
            experiment = self.client.get_experiment_by_name("ringtrain")
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment("ringtrain"))
            self.run_id = self.client.create_run(experiment_id, run_name=os.path.basename(os.path.abspath(folder))).info.run_id
            with open(id_file, "w") as f:
                f.write(self.run_id)

    def write(self, step: int, values: dict[str, float], wall_time: float) -> None:
        from mlflow.entities import Metric

        stamp = int(wall_time * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


ADAPTER = MLflow
