"""Which weights a Spark should hold: its model source resolved, on the controller, to one generation.

A generation is an immutable set of files named by what it is: the Hub commit for `hf://` sources, the sha256 of
the SHA256SUMS for a mirror or a controller directory. Weights land in `model_dir/<model>/<generation>`, so
staging a new one never touches the one being served and a rollback finds the previous one in place. Every
Spark verifies what it stages against the generation's SHA256SUMS, written here once for the whole fleet:
from the Hub's own metadata (the LFS sha256 of large files; small files are fetched and checked against their
git blob id), a mirror's SHA256SUMS, or a controller directory's files.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.config import ModelSource
from sparkfleet.manifest import controller_sums, weight_files

CACHE = Path.home() / ".cache" / "sparkfleet" / "hub"  # small non-LFS files, fetched to hash them
MAX_SUMS_BYTES = 16 << 20


class SourceError(ValueError):
    """The source cannot be resolved: one sentence naming the variable to fix (the caller adds the host)."""


@dataclass(frozen=True)
class Generation:
    """One resolved set of weights: its directory name, the SHA256SUMS every copy is verified against, and what
    it was resolved from."""

    id: str  # the directory name under model_dir/<model>/
    sums: str  # sha256sum-format lines, sorted by path
    total_bytes: int | None  # None for a mirror (its SHA256SUMS has no sizes)
    source: ModelSource
    commit: str | None = None  # hub: the commit the revision named at deploy time

    @property
    def digest(self) -> str:
        """sha256 of the SHA256SUMS: what the staging manifest records as its source."""
        return hashlib.sha256(self.sums.encode()).hexdigest()

    @property
    def label(self) -> str:
        """How status and drift name it: `org/name@main = 3f2a…` or the source and digest."""
        if self.commit:
            return f"{self.source.repo}@{self.source.revision} = {self.commit[:12]}"
        return f"{self.source} = {self.id}"


_resolved: dict[tuple[str, str | None, str | None], Generation] = {}


def resolve(source: ModelSource, hf_endpoint: str | None = None, hf_token: str | None = None) -> Generation:
    """The generation `source` names now; cached per process (a fleet resolves each source once)."""
    key = (str(source), hf_endpoint, hashlib.sha256(hf_token.encode()).hexdigest() if hf_token else None)
    if key not in _resolved:
        if source.kind == "hub":
            _resolved[key] = _hub(source, hf_endpoint, hf_token)
        elif source.kind == "mirror":
            _resolved[key] = _by_digest(source, _mirror_sums(source), None)
        else:
            text, _ = _controller(source)
            total = sum(p.stat().st_size for p in weight_files(Path(source.path or "")))
            _resolved[key] = _by_digest(source, text, total)
    return _resolved[key]


def _by_digest(source: ModelSource, sums: str, total: int | None) -> Generation:
    return Generation(f"sha256-{hashlib.sha256(sums.encode()).hexdigest()[:16]}", sums, total, source)


def _controller(source: ModelSource) -> tuple[str, str]:
    try:
        return controller_sums(Path(source.path or ""))
    except OSError as error:
        raise SourceError(f"`model_source` {source} cannot be read on the controller ({error.strerror}): "
                          "give a readable directory holding the weights") from None


def _mirror_sums(source: ModelSource) -> str:
    try:
        with urllib.request.urlopen(source.sums_url, timeout=30) as response:
            data = response.read(MAX_SUMS_BYTES + 1)
    except (urllib.error.URLError, OSError) as error:
        why = getattr(error, "reason", None) or error
        raise SourceError(f"`model_source` {source}: its SHA256SUMS cannot be fetched ({why}): check the mirror "
                          "URL, or publish SHA256SUMS (`sha256sum` of every file) beside the weights") from None
    if len(data) > MAX_SUMS_BYTES:
        raise SourceError(f"`model_source` {source}: {source.sums_url} is larger than a SHA256SUMS can be")
    return data.decode("utf-8", errors="replace")


def git_blob_id(data: bytes) -> str:
    """The id git (and the Hub) gives a file's content: sha1 of `blob <size>\\0<content>`."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _hub(source: ModelSource, endpoint: str | None, token: str | None) -> Generation:
    """The Hub's commit for the revision, and the sha256 of each of its files as the Hub lists them."""
    import httpx2  # huggingface_hub 2's HTTP client: its connection errors are not OSErrors
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(endpoint=endpoint, token=token or False)
    where = f"`model_source` {source}"
    try:
        api.auth_check(source.repo or "")  # a gated repository lists its files to anyone: ask for access first
        info = api.model_info(source.repo or "", revision=source.revision, files_metadata=True)
        lines = []
        total = 0
        for sibling in sorted(info.siblings or [], key=lambda s: s.rfilename):
            if sibling.lfs is not None:
                sha = sibling.lfs.sha256
            else:
                path = hf_hub_download(source.repo or "", sibling.rfilename, revision=info.sha, endpoint=endpoint,
                                       token=token or False, cache_dir=CACHE)
                data = Path(path).read_bytes()
                if git_blob_id(data) != sibling.blob_id:
                    raise SourceError(f"{where}: {sibling.rfilename} does not match the Hub's blob id "
                                      f"{sibling.blob_id}: a proxy or mirror (hf_endpoint) altered it")
                sha = hashlib.sha256(data).hexdigest()
            lines.append(f"{sha}  {sibling.rfilename}\n")
            total += sibling.size or 0
    except GatedRepoError:
        fix = ("the token in `hf_token` has no access to it: accept the model's terms on the Hub with that account"
               if token else "set `hf_token` to a token of an account that accepted the model's terms")
        raise SourceError(f"{where}: the repository is gated; {fix}") from None
    except RepositoryNotFoundError:
        raise SourceError(f"{where}: the Hub has no repository {source.repo} (or it is private and `hf_token` is "
                          "not set): check the name") from None
    except RevisionNotFoundError:
        raise SourceError(f"{where}: {source.repo} has no revision {source.revision!r}: give a branch, tag or "
                          "commit of it") from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        if status == 401:
            raise SourceError(f"{where}: the Hub refused the token in `hf_token` (401): renew it") from None
        raise SourceError(f"{where}: the Hub answered {status}: {str(error).splitlines()[0]}") from None
    except (OSError, httpx2.HTTPError) as error:  # connection refused, DNS, timeouts
        raise SourceError(f"{where}: the Hub at {endpoint or 'huggingface.co'} cannot be reached ({error}): check "
                          "the network or `hf_endpoint`") from None
    if not lines:
        raise SourceError(f"{where}: revision {source.revision} of {source.repo} has no files")
    return Generation(info.sha or "", "".join(lines), total, source, commit=info.sha)
