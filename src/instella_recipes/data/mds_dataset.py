"""streaming's `StreamingDataset` whose background threads' errors stop the run (imported only once
mosaicml-streaming is known to be installed: `mds.streaming_dataset`).

Why a subclass: streaming prepares shards in two background threads per epoch; an exception there (a shard deleted
or damaged after the start-up checks, `mds_checks`) is raised inside a future's done-callback, where
`concurrent.futures` only logs it, and the epoch then simply ends. A run would train 0 steps (or fewer rows than
asked) and finish as if complete. `on_exception` is streaming's public hook for exactly those futures: it records
the error here (instead of a traceback in the log), and `__iter__` raises it as one `RecipeError` once the epoch
stops.
"""

from streaming import StreamingDataset

from instella_recipes.core import RecipeError

from .mds_checks import MDSDataError


class CheckedStreamingDataset(StreamingDataset):
    """`StreamingDataset` (same arguments) whose iteration raises a background thread's error (module docstring)."""

    thread_error: BaseException | None = None

    def on_exception(self, future) -> None:
        error = future.exception()
        if error is not None and self.thread_error is None:
            self.thread_error = error  # before streaming sets its event, which ends the epoch's loop
        try:
            super().on_exception(future)  # sets the event, then re-raises into `concurrent.futures`, which logs it
        except BaseException:  # noqa: BLE001 - recorded above and raised once, as one line, by `__iter__`
            pass

    def __iter__(self):
        self.thread_error = None
        try:
            yield from super().__iter__()
        except RecipeError:
            raise
        except (RuntimeError, OSError, ValueError) as err:  # streaming's "Background thread failed", a shard that
            raise self._error(self.thread_error or err) from None  # cannot be read or prepared again
        if self.thread_error is not None:
            raise self._error(self.thread_error)

    def _error(self, error: BaseException) -> MDSDataError:
        folders = ", ".join(str(stream.local) for stream in self.streams)
        said = (str(error).splitlines() or [""])[0][:300]
        return MDSDataError(
            f"mds_streams: reading {folders} failed ({type(error).__name__}: {said}); "
            f"the run stopped without a final model: check the folder (a shard removed or changed while training), "
            f"then rerun to resume from the last checkpoint"
        )
