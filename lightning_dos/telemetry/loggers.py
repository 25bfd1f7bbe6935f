"""Owns the W&B logger the recipes use: online when a key exists, offline otherwise, CSV when wandb is missing.

``DOSWandbLogger`` is Lightning's ``WandbLogger`` with three safety nets, so a recipe naming it runs on every
machine without a prompt or a crash: with no W&B API key (no ``WANDB_API_KEY``, no ``wandb login`` entry
in the netrc file) and no ``WANDB_MODE``, it logs offline and says how to sync later; where ``wandb`` is
not installed the same name is a ``CSVLogger`` taking the same arguments, and says so in one line (the
choice is made once, when this module is imported); and when W&B fails during a run (unreachable, an error while
logging, a full disk), training goes on and everything from then on is logged to CSV under
``<save_dir>/<recipe>/version_N``, with one warning (tables and images, which CSV cannot hold, are dropped).

Its ``name`` is the recipe (as a ``CSVLogger``'s name is the experiment its versions belong to); the W&B run
itself is named, grouped and tagged by :func:`lightning_dos.telemetry.run_info.configure_run` (the CLI calls it), which
hands the identity to :meth:`DOSWandbLogger.set_run_identity` before the run starts. ``run_name``, ``group``,
``job_type`` and ``tags`` given explicitly always win over it.
"""

from __future__ import annotations

import netrc
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Optional, Union
from urllib.parse import urlsplit

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn
from typing_extensions import override

__all__ = ["DOSWandbLogger", "has_wandb_api_key", "wandb_available"]

_DEFAULT_HOST = "https://api.wandb.ai"


def wandb_available() -> bool:
    """Whether ``import wandb`` works here."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    return True


def _netrc_path() -> Optional[Path]:
    # the lookup order wandb itself uses: $NETRC, then ~/.netrc, then ~/_netrc
    if os.environ.get("NETRC"):
        return Path(os.environ["NETRC"]).expanduser()
    for name in ("~/.netrc", "~/_netrc"):
        path = Path(name).expanduser()
        if path.is_file():
            return path
    return None


def has_wandb_api_key() -> bool:
    """Whether W&B credentials exist: ``WANDB_API_KEY``, an identity token file, or a netrc entry for the host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    path = _netrc_path()
    if path is None or not path.is_file():
        return False
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or _DEFAULT_HOST).netloc
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return False
    return bool(entry and entry[2])


def _say(message: str) -> None:
    if rank_zero_only.rank == 0:
        print(message, file=sys.stderr, flush=True)


if wandb_available():

    class DOSWandbLogger(WandbLogger):
        """Lightning's ``WandbLogger`` that never prompts for a key: it logs offline when there is none.

        Args:
            name: The recipe (experiment) name, e.g. ``"debug"``; the run is named ``<name>-<strategy>[-<plan>]``
                once :meth:`set_run_identity` is called (else ``name`` itself).
            save_dir: Directory the run's files go under (``<save_dir>/wandb/...``); created if missing.
            version: Run id, to resume a run.
            offline: Log offline even when a key exists.
            project: W&B project (``$WANDB_PROJECT`` or ``lightning_logs`` when None).
            log_model: Upload checkpoints as artifacts (``"all"``: every one); off when offline.
            prefix: Prefix of every metric key.
            entity: W&B team or user the run belongs to (None: the key's default entity).
            group: Group runs together (e.g. one strategy sweep).
            tags: Labels shown in the W&B run table.
            notes: A longer description of the run.
            run_name: Display name of the run, kept as given (None: derived from ``name`` and the strategy).
            job_type: W&B job type of the run, kept as given (None: the strategy, via :meth:`set_run_identity`).
            **kwargs: Any other argument of ``WandbLogger`` or ``wandb.init``.

        ``group`` and ``tags`` left None are likewise filled by :meth:`set_run_identity`. Where ``wandb`` cannot
        be imported, this name is a ``CSVLogger`` taking the same arguments.
        """

        def __init__(
            self,
            name: Optional[str] = None,
            save_dir: str = ".",
            version: Optional[str] = None,
            offline: bool = False,
            project: Optional[str] = None,
            log_model: Union[Literal["all"], bool] = False,
            prefix: str = "",
            entity: Optional[str] = None,
            group: Optional[str] = None,
            tags: Optional[list[str]] = None,
            notes: Optional[str] = None,
            run_name: Optional[str] = None,
            job_type: Optional[str] = None,
            **kwargs: Any,
        ) -> None:
            self._recipe = name
            # what the user set stays; set_run_identity fills only the rest
            self._explicit = {"name": run_name is not None, "group": group is not None,
                              "job_type": job_type is not None, "tags": tags is not None}
            self._identity: dict[str, Any] = {}
            # no key and no explicit mode: wandb would prompt on a terminal and fail without one, so go offline
            self.offline_fallback = not offline and not os.environ.get("WANDB_MODE") and not has_wandb_api_key()
            if self.offline_fallback:
                offline = True
                log_model = False  # checkpoints cannot be uploaded offline
            Path(save_dir).mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir if it is missing
            init = {key: value for key, value in dict(entity=entity, group=group, tags=tags, notes=notes,
                                                      job_type=job_type).items() if value is not None}
            super().__init__(
                name=run_name if run_name is not None else name, save_dir=save_dir, version=version,
                offline=offline, project=project, log_model=log_model, prefix=prefix, **init, **kwargs,
            )
            if self._wandb_init.get("anonymous") is None:
                self._wandb_init.pop("anonymous", None)  # recent wandb warns about the setting even when unset
            self._announced = False

        @property
        def recipe(self) -> Optional[str]:
            """The ``name`` given: the recipe the run belongs to (W&B's group unless set explicitly)."""
            return self._recipe

        def set_run_identity(self, name: Optional[str] = None, group: Optional[str] = None,
                             job_type: Optional[str] = None, tags: Optional[list[str]] = None) -> None:
            """Name, group, job type and tags for the W&B run, used when it starts; those set explicitly are kept.

            Must be called before the run starts (before ``trainer.fit``, which starts it in its setup hook);
            a started run keeps what it has, with a warning.
            """
            if self._experiment is not None:
                rank_zero_warn("set_run_identity: the W&B run has already started, so its name, group, job type "
                               "and tags stay as they are; call it (or configure_run(trainer)) before trainer.fit")
                return
            given = {"name": name, "group": group, "job_type": job_type, "tags": list(tags) if tags else None}
            self._identity = {key: value for key, value in given.items()
                              if value is not None and not self._explicit[key]}

        @property
        def wandb_init_kwargs(self) -> dict[str, Any]:
            """The arguments ``wandb.init`` gets when the run starts (the explicit ones, then the identity)."""
            return {**self._wandb_init, **self._identity}

        @property
        @rank_zero_experiment
        def experiment(self) -> Any:
            """The wandb run (created on first use); announces the offline fallback once, naming the run directory.
            If W&B cannot start the run (unreachable, out of disk), the CSV stand-in's writer (:attr:`failed_over`)."""
            if self._csv is not None:
                return self._csv.experiment
            if self._experiment is None:
                self._wandb_init.update(self._identity)
            try:
                run = super().experiment
            except Exception as err:  # noqa: BLE001  (wandb raises many kinds; training must go on)
                return self._fail_over("starting the run", err).experiment
            if self.offline_fallback and not self._announced:
                self._announced = True
                run_dir = Path(run.dir).parent if getattr(run, "dir", None) else Path(self.save_dir or ".") / "wandb"
                _say(f"W&B: no API key found, logging offline to {run_dir} (sync later with `wandb sync {run_dir}`)")
            return run

        # ---------------------------------------------------------------- when W&B fails, training goes on
        _csv: Optional[CSVLogger] = None

        @property
        def failed_over(self) -> Optional[CSVLogger]:
            """The CSV logger taking this logger's metrics since W&B failed (None while W&B works)."""
            return self._csv

        def _fail_over(self, what: str, err: BaseException) -> CSVLogger:
            """From now on log to CSV under ``<save_dir>/<recipe>/version_N``; say so once."""
            if self._csv is None:
                self._csv = CSVLogger(save_dir=self.save_dir or ".", name=self._recipe or "lightning_logs")
                rank_zero_warn(f"W&B: {what} failed ({type(err).__name__}: {err}); training goes on and logs to CSV "
                               f"under {self._csv.log_dir} from here (W&B keeps what it had)")
            return self._csv

        def _guard(self, what: str, call: Any, fallback: Any = None) -> None:
            if self._csv is None:
                try:
                    call()
                    return
                except Exception as err:  # noqa: BLE001
                    self._fail_over(what, err)
            if fallback is not None:
                fallback(self._csv)

        @override
        @rank_zero_only
        def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
            self._guard("logging metrics", lambda: super(DOSWandbLogger, self).log_metrics(metrics, step),
                        lambda csv: csv.log_metrics(metrics, step))

        @override
        @rank_zero_only
        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            self._guard("logging the run config", lambda: super(DOSWandbLogger, self).log_hyperparams(params),
                        lambda csv: csv.log_hyperparams(params))

        @override
        @rank_zero_only
        def log_table(self, *args: Any, **kwargs: Any) -> None:
            # tables and images have no CSV form: after a failure they are dropped (the warning said so)
            self._guard("logging a table", lambda: super(DOSWandbLogger, self).log_table(*args, **kwargs))

        @override
        @rank_zero_only
        def log_image(self, *args: Any, **kwargs: Any) -> None:
            self._guard("logging an image", lambda: super(DOSWandbLogger, self).log_image(*args, **kwargs))

        @override
        def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
            self._guard("logging a checkpoint", lambda: super(DOSWandbLogger, self).after_save_checkpoint(
                checkpoint_callback))

        @override
        @rank_zero_only
        def save(self) -> None:
            self._guard("saving", lambda: super(DOSWandbLogger, self).save(), lambda csv: csv.save())

        @override
        @rank_zero_only
        def finalize(self, status: str) -> None:
            self._guard("finishing the run", lambda: super(DOSWandbLogger, self).finalize(status),
                        lambda csv: csv.finalize(status))

else:

    class DOSWandbLogger(CSVLogger):  # type: ignore[no-redef]
        """Stands in for the W&B logger where ``wandb`` cannot be imported: CSV under ``<save_dir>/<name>``.

        Takes the W&B logger's arguments so a recipe naming it runs unchanged; the W&B-only ones are ignored.
        """

        def __init__(
            self,
            name: Optional[str] = None,
            save_dir: str = ".",
            version: Optional[str] = None,
            offline: bool = False,
            project: Optional[str] = None,
            log_model: Union[Literal["all"], bool] = False,
            prefix: str = "",
            entity: Optional[str] = None,
            group: Optional[str] = None,
            tags: Optional[list[str]] = None,
            notes: Optional[str] = None,
            run_name: Optional[str] = None,
            job_type: Optional[str] = None,
            **kwargs: Any,
        ) -> None:
            name = name or "lightning_logs"
            _say(f"W&B: wandb is not installed, logging to CSV under {Path(save_dir) / name} instead "
                 "(pip install wandb to log to W&B)")
            super().__init__(save_dir=save_dir, name=name, version=version, prefix=prefix)

        @property
        def recipe(self) -> str:
            """The ``name`` given: the recipe the run belongs to (``runs/<name>/version_N``)."""
            return self.name
