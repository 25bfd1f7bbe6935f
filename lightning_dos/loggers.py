"""Owns the W&B logger the recipes use: online when a key exists, offline otherwise, CSV when wandb is missing.

``DOSWandbLogger`` is Lightning's ``WandbLogger`` with two safety nets, so a recipe naming it runs on every
machine without a prompt or a crash: with no W&B API key (no ``WANDB_API_KEY``, no ``wandb login`` entry
in the netrc file) and no ``WANDB_MODE``, it logs offline and says how to sync later; and where ``wandb`` is
not installed the same name is a ``CSVLogger`` taking the same arguments, and says so in one line (the
choice is made once, when this module is imported).
"""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path
from typing import Any, Literal, Optional, Union
from urllib.parse import urlsplit

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

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
            name: Display name of the run.
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
            **kwargs: Any other argument of ``WandbLogger`` or ``wandb.init``.

        Where ``wandb`` cannot be imported, this name is a ``CSVLogger`` taking the same arguments.
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
            **kwargs: Any,
        ) -> None:
            # no key and no explicit mode: wandb would prompt on a terminal and fail without one, so go offline
            self.offline_fallback = not offline and not os.environ.get("WANDB_MODE") and not has_wandb_api_key()
            if self.offline_fallback:
                offline = True
                log_model = False  # checkpoints cannot be uploaded offline
            Path(save_dir).mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir if it is missing
            init = {key: value for key, value in dict(entity=entity, group=group, tags=tags, notes=notes).items()
                    if value is not None}
            super().__init__(
                name=name, save_dir=save_dir, version=version, offline=offline, project=project,
                log_model=log_model, prefix=prefix, **init, **kwargs,
            )
            if self._wandb_init.get("anonymous") is None:
                self._wandb_init.pop("anonymous", None)  # recent wandb warns about the setting even when unset
            self._announced = False

        @property
        @rank_zero_experiment
        def experiment(self) -> Any:
            """The wandb run (created on first use); announces the offline fallback once, naming the run directory."""
            run = super().experiment
            if self.offline_fallback and not self._announced:
                self._announced = True
                run_dir = Path(run.dir).parent if getattr(run, "dir", None) else Path(self.save_dir or ".") / "wandb"
                _say(f"W&B: no API key found, logging offline to {run_dir} (sync later with `wandb sync {run_dir}`)")
            return run

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
            **kwargs: Any,
        ) -> None:
            name = name or "lightning_logs"
            _say(f"W&B: wandb is not installed, logging to CSV under {Path(save_dir) / name} instead "
                 "(pip install wandb to log to W&B)")
            super().__init__(save_dir=save_dir, name=name, version=version, prefix=prefix)
