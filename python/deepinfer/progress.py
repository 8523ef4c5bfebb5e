"""The progress bar of LLM.generate: tqdm when installed (vLLM's
"Processed prompts" bar with input/output speeds), else a one-line bar on
stderr."""
import sys
import time


class _SimpleBar:
    def __init__(self, total, desc):
        self.total, self.desc, self.n = total, desc, 0
        self.postfix = ""
        self.t_last = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, k):
        self.n += k
        self._draw()

    def set_postfix_str(self, s, refresh=True):
        self.postfix = s

    def _draw(self, force=False):
        now = time.monotonic()
        if not force and now - self.t_last < 0.2 and self.n < self.total:
            return
        self.t_last = now
        width = 30
        fill = width * self.n // max(self.total, 1)
        line = "%s: [%s%s] %d/%d %s" % (self.desc, "#" * fill, "." * (width - fill), self.n, self.total, self.postfix)
        if self.tty:
            sys.stderr.write("\r" + line)
        elif self.n >= self.total:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self):
        if self.tty:
            self._draw(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()


def make_bar(total, desc, use_tqdm):
    """use_tqdm: False (none), True (tqdm if importable, else the simple bar)
    or a callable tqdm-like factory, as vLLM allows."""
    if not use_tqdm:
        return None
    if callable(use_tqdm):
        return use_tqdm(total=total, desc=desc, dynamic_ncols=True)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _SimpleBar(total, desc)
    return tqdm(total=total, desc=desc, dynamic_ncols=True)
