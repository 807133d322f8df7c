"""Upload an exported folder to the Hugging Face Hub with ``huggingface_hub.HfApi``."""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from timm_ext.hub._folder import check_folder
from timm_ext.load_errors import HubError, first_line

__all__ = ['PushResult', 'push']

_REPO_ID = re.compile(r'^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$')
_SHA = re.compile(r'^[0-9a-f]{40}$')


@dataclass(frozen=True)
class PushResult:
    repo_id: str
    revision: str
    commit: Optional[str]
    commit_url: Optional[str]

    @property
    def pinned_id(self) -> str:
        """``ORG/NAME@<commit sha>``: the reproducible ``hf_hub_id`` of a registered pretrained tag."""
        return f'{self.repo_id}@{self.commit}' if self.commit else self.repo_id


def push(
        folder: Union[str, Path],
        repo_id: str,
        private: bool = False,
        revision: Optional[str] = None,
        commit_message: Optional[str] = None,
        token: Optional[str] = None,
) -> PushResult:
    """Check ``folder`` as :func:`check_folder` does, then create the model repo (if needed) and upload it.

    ``revision`` is a branch, created from main when absent; the token is huggingface_hub's
    (``HF_TOKEN`` or ``hf auth login``) unless given.
    """
    if not _REPO_ID.match(repo_id):
        raise HubError(f'repo id {repo_id!r} must be ORG/NAME (letters, digits, "-", "_", ".")')
    if revision is not None and (_SHA.match(revision) or not revision.strip()):
        raise HubError(f'revision {revision!r} must be a branch name, not a commit: a push creates a new commit')
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise HubError(f'{folder} is not a folder: export one first with `timm-ext export`')
    config = check_folder(folder)
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id=repo_id, repo_type='model', private=private, exist_ok=True)
        if revision is not None and revision != 'main':
            api.create_branch(repo_id=repo_id, branch=revision, repo_type='model', exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), repo_type='model', revision=revision,
            commit_message=commit_message or f'Upload {config["architecture"]} (timm-ext export)')
    except Exception as e:  # HTTP errors, no token, offline mode: the hub's own message, on one line
        raise HubError(f'pushing {folder} to {repo_id} failed: {type(e).__name__}: {first_line(e)}') from None
    return PushResult(repo_id, revision or 'main', getattr(info, 'oid', None), getattr(info, 'commit_url', None))
