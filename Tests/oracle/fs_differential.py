"""The protected file system judged by the kernel's own tmpfs.

Usage: fs_differential.py MOUNTED_DIR TMPFS_DIR SEED EXAMPLES STEPS

Hypothesis' stateful testing applies the same random sequences of operations (create, write at
random offsets, truncate, rename with and without flags, link, unlink, mkdir, rmdir, symlink,
fsync, reopen, read, stat, set times, change the umask) to a directory on the mount and to a
directory on tmpfs, and requires the same results, the same errors, the same contents and modes
after every step. The caller's umask varies (the server's own must never apply on top of it), and
times set just before or just after a close must stay what was set (the close's RELEASE reaches
the server after close() returned, before or after the SETATTR). On a failure it prints
the shortest sequence it found and the seed to run it again.
"""
import errno
import os
import shutil
import sys

from hypothesis import HealthCheck, Phase, settings, seed as fixed_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

MOUNTED, REFERENCE, SEED, EXAMPLES, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

NAMES = ["a", "b", "c", "d/a", "d/b", "d/e/a", "e"]
DIRECTORIES = ["d", "d/e", "e"]
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2

libc = None
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
except OSError:
    pass


OPERATIONS = [0]


def outcome(function, *args):
    """What a call did: ("ok", its value) or ("error", errno's name)."""
    OPERATIONS[0] += 1
    try:
        return ("ok", function(*args))
    except OSError as error:
        return ("error", errno.errorcode.get(error.errno, str(error.errno)))


def renameat2(old, new, flags):
    if libc.renameat2(-100, old.encode(), -100, new.encode(), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def snapshot(root):
    """Every name below root: its type and mode, and a file's size, link count and bytes; a link's target."""
    found = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                found[relative] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[relative] = ("dir", oct(st.st_mode & 0o7777))
            else:
                with open(path, "rb") as f:
                    found[relative] = ("file", st.st_size, st.st_nlink, oct(st.st_mode & 0o7777), f.read())
    return found


class SameAsTmpfs(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.open = {}   # name -> (fd on the mount, fd on tmpfs)
        self.roots = []
        self.times = {}  # name -> the modification time (ns) set on it, while nothing changed it since

    @initialize()
    def fresh_roots(self):
        # Each example starts from nothing: the roots are one level below what is removed, so
        # that a link to "../a" (made at a root) lands in it too, never in what the next example
        # finds (Hypothesis requires the same steps to give the same states).
        self.roots = []
        for base in (MOUNTED, REFERENCE):
            case = os.path.join(base, "case")
            if os.path.lexists(case):
                shutil.rmtree(case)
            os.mkdir(case)
            root = os.path.join(case, "root")
            os.mkdir(root)
            self.roots.append(root)

    def both(self, action, *names, **options):
        """Runs action on each side with the names made absolute; the outcomes must agree."""
        results = [outcome(action, *[os.path.join(root, name) for name in names], **options) for root in self.roots]
        assert results[0] == results[1], "mount %r, tmpfs %r for %s%r" % (results[0], results[1], action.__name__, names)
        return results[0]

    def close_all(self, name=None):
        for key in list(self.open):
            if name is None or key == name:
                for fd in self.open.pop(key):
                    os.close(fd)

    def teardown(self):
        self.close_all()
        os.umask(0o022)

    @rule(mask=st.sampled_from([0o000, 0o002, 0o022, 0o077]))
    def umask(self, mask):
        os.umask(mask)

    @rule(name=st.sampled_from(NAMES), nanoseconds=st.integers(0, 2_000_000_000_000_000_000), still_open=st.booleans())
    def set_times(self, name, nanoseconds, still_open):
        """A time set while the file is open (its RELEASE comes after), or right after a close."""
        if not still_open:
            self.close_all(name)
        result = self.both(lambda path: os.utime(path, ns=(nanoseconds, nanoseconds)), name)
        self.close_all(name)
        self.times.clear()   # another name may be the same file (a link): only this one is known
        if result[0] == "ok":
            self.times[name] = nanoseconds

    @rule(name=st.sampled_from(NAMES), exclusive=st.booleans(), mode=st.sampled_from([0o644, 0o666, 0o600, 0o4755, 0o777]))
    def create(self, name, exclusive, mode):
        self.times.clear()
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if exclusive else 0)
        fds = [outcome(os.open, os.path.join(root, name), flags, mode) for root in self.roots]
        assert fds[0][0] == fds[1][0] and (fds[0][0] == "ok" or fds[0] == fds[1]), "create %s: %r" % (name, fds)
        if fds[0][0] == "ok":
            self.close_all(name)
            self.open[name] = (fds[0][1], fds[1][1])

    @rule(name=st.sampled_from(NAMES), truncate=st.booleans())
    def reopen(self, name, truncate):
        self.times.clear()
        self.close_all(name)
        flags = os.O_RDWR | (os.O_TRUNC if truncate else 0)
        fds = [outcome(os.open, os.path.join(root, name), flags) for root in self.roots]
        assert fds[0][0] == fds[1][0] and (fds[0][0] == "ok" or fds[0] == fds[1]), "open %s: %r" % (name, fds)
        if fds[0][0] == "ok":
            self.open[name] = (fds[0][1], fds[1][1])

    @precondition(lambda self: self.open)
    @rule(data=st.data(), offset=st.integers(0, 70000), payload=st.binary(min_size=0, max_size=9000))
    def write(self, data, offset, payload):
        self.times.clear()
        name = data.draw(st.sampled_from(sorted(self.open)))
        results = [outcome(os.pwrite, fd, payload, offset) for fd in self.open[name]]
        assert results[0] == results[1], "pwrite %s: %r" % (name, results)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), offset=st.integers(0, 80000), size=st.integers(0, 20000))
    def read(self, data, offset, size):
        name = data.draw(st.sampled_from(sorted(self.open)))
        results = [outcome(os.pread, fd, size, offset) for fd in self.open[name]]
        assert results[0] == results[1], "pread %s at %d: differs" % (name, offset)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), size=st.integers(0, 90000))
    def truncate_open(self, data, size):
        self.times.clear()
        name = data.draw(st.sampled_from(sorted(self.open)))
        results = [outcome(os.ftruncate, fd, size) for fd in self.open[name]]
        assert results[0] == results[1], "ftruncate %s: %r" % (name, results)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def fsync(self, data):
        name = data.draw(st.sampled_from(sorted(self.open)))
        results = [outcome(os.fsync, fd) for fd in self.open[name]]
        assert results[0] == results[1]

    @rule(name=st.sampled_from(NAMES), size=st.integers(0, 90000))
    def truncate_path(self, name, size):
        self.times.clear()
        self.both(lambda path: os.truncate(path, size), name)

    @rule(name=st.sampled_from(NAMES))
    def close(self, name):
        self.close_all(name)

    @rule(source=st.sampled_from(NAMES + DIRECTORIES), destination=st.sampled_from(NAMES + DIRECTORIES),
          flags=st.sampled_from([0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
    def rename(self, source, destination, flags):
        self.times.clear()
        if flags:
            self.both(lambda a, b: renameat2(a, b, flags), source, destination)
        else:
            self.both(os.rename, source, destination)

    @rule(source=st.sampled_from(NAMES), destination=st.sampled_from(NAMES))
    def link(self, source, destination):
        self.times.clear()
        self.both(os.link, source, destination)

    @rule(name=st.sampled_from(NAMES))
    def unlink(self, name):
        self.times.clear()
        self.both(os.unlink, name)

    @rule(name=st.sampled_from(DIRECTORIES), mode=st.sampled_from([0o777, 0o755, 0o1777, 0o700]))
    def mkdir(self, name, mode):
        self.both(lambda path: os.mkdir(path, mode), name)

    @rule(name=st.sampled_from(DIRECTORIES))
    def rmdir(self, name):
        self.times.clear()
        self.both(os.rmdir, name)

    @rule(pointing=st.sampled_from(["a", "../a", "d", "missing", "d/e/a"]), name=st.sampled_from(NAMES))
    def symlink(self, pointing, name):
        self.times.clear()
        results = [outcome(os.symlink, pointing, os.path.join(root, name)) for root in self.roots]
        assert results[0] == results[1], "symlink %s: %r" % (name, results)

    @rule(name=st.sampled_from(NAMES + DIRECTORIES))
    def stat(self, name):
        def describe(path):
            st = os.lstat(path)
            kind = "dir" if os.path.isdir(path) and not os.path.islink(path) else "link" if os.path.islink(path) else "file"
            return (kind, st.st_size if kind == "file" else None, st.st_nlink if kind == "file" else None, oct(st.st_mode & 0o7777))
        self.both(describe, name)

    @rule(name=st.sampled_from(NAMES))
    def read_whole(self, name):
        def whole(path):
            with open(path, "rb") as f:
                return f.read()
        self.both(whole, name)

    @invariant()
    def times_kept(self):
        for name, nanoseconds in self.times.items():
            found = [os.stat(os.path.join(root, name)).st_mtime_ns for root in self.roots]
            assert found == [nanoseconds, nanoseconds], "mtime of %s: mount %d, tmpfs %d, set %d" % (name, found[0], found[1], nanoseconds)

    @invariant()
    def same_tree(self):
        if not self.roots:
            return
        mounted, reference = snapshot(self.roots[0]), snapshot(self.roots[1])
        if mounted != reference:
            differing = sorted(name for name in set(mounted) | set(reference) if mounted.get(name) != reference.get(name))
            detail = [(name, str(mounted.get(name))[:120], str(reference.get(name))[:120]) for name in differing[:5]]
            raise AssertionError("trees differ: %r" % detail)


SameAsTmpfs.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
                                         suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])

if __name__ == "__main__":
    import unittest
    print("fs_differential: seed %d, %d sequences of up to %d operations" % (SEED, EXAMPLES, STEPS), flush=True)
    case = fixed_seed(SEED)(SameAsTmpfs.TestCase)
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=0).run(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    if not result.wasSuccessful():
        print("fs_differential: FAILED with seed %d (run again: fs_differential.py MOUNT TMPFS %d %d %d)" % (SEED, SEED, EXAMPLES, STEPS))
        sys.exit(1)
    print("fs_differential: same as tmpfs after %d operations on each side" % (OPERATIONS[0] // 2))
