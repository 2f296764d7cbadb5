"""The sandboxed program's own interpreter: reads the program, installs the audit hook, runs it.

The supervisor starts a fresh `python -I -S -B` with this file's code (never an interpreter that
ran anything else: no module, frame or object of the sandbox is reachable from the program), in a
process the kernel already confines (confine.py). Standard library only; nothing from reasonrl.

The audit hook (`audit=True`) denies by default, at the three places Python lets it:

- Events: those in `HARMLESS_EVENTS` pass, those in `PATH_EVENTS` pass once their paths are
  checked; every other event is refused, whatever it is: processes, signals, sockets, ctypes,
  rlimits, tracing and profiling, gc introspection, links, and any event a later Python adds.
- Modules: only those in `ALLOWED_MODULES` (computation, text, data structures, files) import;
  a compiled extension loaded by path must also be named there, its file named after the last part
  of the module's name (the part its init function is named after), and the file must lie in the
  interpreter's own directories: a copy written or renamed into the working directory is refused
  (a renamed `_posixsubprocess` loaded as `json._posixsubprocess` would otherwise start processes).
  `_posixsubprocess`, `subprocess`, `socket`, `ctypes`, `mmap`, `fcntl`, `resource`... are not:
  importing them raises ModuleNotFoundError, so that optional imports fall back as usual.
- Paths: a path is a `str`, `bytes` or an open descriptor (a PathLike object could answer the
  check and the open differently); writes go only under the working directory (and /dev/null),
  reads also under the interpreter's standard library and /dev/zero, /dev/urandom; a relative path
  may not climb (`..`), directories open only under the working directory, and `dir_fd=` is refused
  where an event reports it (for `open`, which does not, a directory descriptor can only point
  inside the working directory, where a relative path without `..` stays).

What the interpreter does without raising any event cannot be denied by default: those functions
(`UNAUDITED`: pidfd_open, pidfd_send_signal, mkfifo, mknod, memfd_create, posix_fallocate, and calls
that change other processes' scheduling) are deleted before the program starts, the allowed builtin modules
are created up front and `_imp.create_builtin` is deleted, so that the stripped modules cannot be
created afresh. The hook is one function whose closure holds only immutable values, builtin types
and C functions: a program that catches a refusal and walks the traceback to the hook's frame finds
nothing to change there.

This is a speed bump, not a wall (CPython's documentation says so of audit hooks): native code and
interpreter internals step around it, so the kernel layers are built to hold without it, and the
tests check them with `audit=False`.
"""

from __future__ import annotations

EXIT_MEMORY = 86  # the exit code after an uncaught MemoryError (a program exiting 86 itself reads as "memory")

ALLOWED_MODULES = frozenset({
    # the interpreter's own (mostly loaded at startup) and the import system
    "__future__", "__main__", "_abc", "_codecs", "_collections_abc", "_frozen_importlib",
    "_frozen_importlib_external", "_imp", "_io", "_signal", "_thread", "_warnings", "_weakref", "_weakrefset",
    "abc", "builtins", "codecs", "encodings", "genericpath", "importlib", "io", "marshal", "os", "posix",
    "posixpath", "signal", "stat", "_stat", "sys", "time", "zipimport", "atexit", "errno", "gc", "warnings",
    # data structures and algorithms
    "array", "bisect", "_bisect", "collections", "_collections", "contextlib", "contextvars", "_contextvars",
    "copy", "copyreg", "dataclasses", "enum", "functools", "_functools", "graphlib", "heapq", "_heapq",
    "itertools", "keyword", "operator", "_operator", "queue", "_queue", "reprlib", "types", "typing",
    "_typing", "weakref", "threading", "_threading_local", "concurrent", "sched",
    # numbers
    "cmath", "decimal", "_decimal", "_pydecimal", "fractions", "math", "numbers", "random", "_random",
    "statistics", "_statistics",
    # text and data formats
    "base64", "binascii", "codeop", "csv", "_csv", "difflib", "fnmatch", "html", "json", "_json", "locale",
    "_locale", "pprint", "re", "_sre", "sre_compile", "sre_constants", "sre_parse", "string", "_string",
    "stringprep", "struct", "_struct", "textwrap", "unicodedata", "pickle", "_pickle", "_compat_pickle",
    "ipaddress", "urllib", "xml", "pyexpat", "_elementtree",
    # hashes, compression, dates, identifiers
    "hashlib", "_hashlib", "_md5", "_sha1", "_sha256", "_sha512", "_sha3", "_blake2", "hmac", "secrets",
    "zlib", "gzip", "bz2", "_bz2", "lzma", "_lzma", "_compression", "zipfile", "calendar", "datetime",
    "_datetime", "_strptime", "zoneinfo", "_zoneinfo", "uuid", "_uuid", "colorsys",
    # the program's own files, tests and introspection of its own code
    "glob", "shutil", "tempfile", "logging", "linecache", "tokenize", "_tokenize", "token", "traceback", "inspect",
    "dis", "opcode", "_opcode", "ast", "_ast", "symtable", "_symtable", "unittest", "argparse", "gettext",
    "doctest", "pdb", "bdb", "cmd", "code", "timeit", "tracemalloc", "_tracemalloc",
})

# Allowed without looking at their arguments: they touch nothing outside the interpreter.
HARMLESS_EVENTS = frozenset({
    "exec", "compile", "code.__new__", "function.__new__", "object.__getattr__", "object.__setattr__",
    "object.__delattr__", "sys._getframe", "sys._getframemodulename", "builtins.id", "builtins.input",
    "builtins.input/result", "time.sleep", "array.__new__", "marshal.loads", "marshal.load", "marshal.dumps",
    "marshal.dump", "pickle.find_class", "os.putenv", "os.unsetenv", "sys.excepthook", "sys.unraisablehook",
    "cpython._PySys_ClearAuditHooks", "glob.glob", "tempfile.mkstemp", "tempfile.mkdtemp", "shutil.copyfile",
    "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.make_archive",
    "shutil.unpack_archive", "locale.setlocale",
})

# Events with paths, and what each argument is: r/w a path read/written, c a directory to enter,
# o open's (path, mode, flags), d a dir_fd (must be absent), . an argument without a path; an import
# that loads a compiled extension has x, the extension's file (only in the interpreter's directories).
PATH_EVENTS = (
    ("open", "o"), ("os.listdir", "r"), ("os.scandir", "r"), ("os.chdir", "c"), ("os.mkdir", "w.d"),
    ("os.remove", "wd"), ("os.rmdir", "wd"), ("os.rename", "wwdd"), ("os.chmod", "w.d"), ("os.utime", "w..d"),
    ("os.truncate", "w."), ("shutil.rmtree", "wd"), ("glob.glob/2", "..rd"),
)

# Functions that raise no audit event and reach outside the program; deleted before it starts.
UNAUDITED = (
    ("posix", ("pidfd_open", "mkfifo", "mknod", "memfd_create", "setpriority", "sched_setaffinity",
               "sched_setscheduler", "sched_setparam", "posix_fallocate")),
    ("_signal", ("pidfd_send_signal",)),
)


def main() -> None:
    """Entry point (the supervisor's `-c`): the last argument holds the settings, marshalled, hex-encoded."""
    import marshal
    import posix
    import sys

    settings = marshal.loads(bytes.fromhex(sys.argv[-1]))
    code = _read_all(settings["code_fd"])
    sys.argv[:] = ["<program>"]
    if b"PYTHONHOME" in posix.environ:  # set only to find the standard library through a descriptor
        posix.unsetenv(b"PYTHONHOME")
        del posix.environ[b"PYTHONHOME"]
    if settings["audit"]:
        confine_interpreter(settings["workdir"], tuple(settings["read_roots"]))
    posix.write(settings["started_fd"], b"1")
    posix.close(settings["started_fd"])
    run(code)


def confine_interpreter(workdir: str, read_roots: tuple[str, ...]) -> None:
    """Strip `UNAUDITED`, freeze the set of builtin modules, install the hook (module docstring)."""
    import _imp
    import sys

    for name in sorted(ALLOWED_MODULES.intersection(sys.builtin_module_names)):
        __import__(name)
    for module_name, names in UNAUDITED:
        module = sys.modules[module_name]
        for name in names:
            module.__dict__.pop(name, None)
    del _imp.create_builtin
    devices = ("/dev/null", "/dev/zero", "/dev/urandom")
    sys.addaudithook(make_hook(workdir, (workdir, *devices, *read_roots)))


def make_hook(workdir: str, readable: tuple[str, ...]):
    """The audit hook: one function, no global or builtin looked up at call time, no Python helper."""
    import posix

    lstat, stat, readlink, getcwd = posix.lstat, posix.stat, posix.readlink, posix.getcwd
    str_type, bytes_type, int_type, type_of, is_subclass, length = str, bytes, int, type, issubclass, len
    as_str, decode = str.__str__, bytes.decode  # exact copies: a str subclass cannot answer differently
    refused, os_error, missing = PermissionError, OSError, ModuleNotFoundError
    harmless, modules, path_events = HARMLESS_EVENTS, ALLOWED_MODULES, PATH_EVENTS
    writable, entered = (workdir, "/dev/null"), (workdir,)
    extension_roots = tuple(root for root in readable if root != workdir and not root.startswith("/dev/"))
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    directory_flags = posix.O_DIRECTORY | posix.O_PATH
    file_type, directory_type, link_type = 0o170000, 0o040000, 0o120000

    def hook(event: str, args: tuple) -> None:
        if event in harmless:
            return
        if event == "import":
            name, filename = args[0], args[1]
            # ModuleNotFoundError, not PermissionError: `try: import x / except ImportError` keeps working.
            if type_of(name) is not str_type or name.partition(".")[0] not in modules:
                raise missing(f"sandbox: import of {name!r} is not allowed")
            if filename is None:
                return
            # A compiled extension: its init function is named after the name's last part, so the file's
            # stem must be that part and allowed; where the file lies is checked below (kind "x").
            if (type_of(filename) is not str_type
                    or filename.rpartition("/")[2].partition(".")[0] != name.rpartition(".")[2]
                    or filename.rpartition("/")[2].partition(".")[0] not in modules):
                raise missing(f"sandbox: loading the extension {filename!r} is not allowed")
            kinds = ".x"
        else:
            kinds = None
            for name, spec in path_events:
                if name == event:
                    kinds = spec
                    break
            if kinds is None:
                raise refused(f"sandbox: {event} is not allowed")
        index = -1
        for kind in kinds:
            index += 1
            value = args[index] if index < length(args) else None
            if kind == "." or value is None:
                continue
            if kind == "d":
                if type_of(value) is not int_type or value != -1:
                    raise refused(f"sandbox: {event} relative to a directory descriptor (dir_fd) is not allowed")
                continue
            if type_of(value) is int_type:
                continue  # an open descriptor, opened under these rules
            if is_subclass(type_of(value), str_type):
                text = as_str(value)
            elif is_subclass(type_of(value), bytes_type):
                text = decode(value, "utf-8", "surrogateescape")
            else:
                raise refused(f"sandbox: {event} of a path given as {type_of(value).__name__} is not allowed "
                              "(pass str(path))")
            if not text.startswith("/"):
                if ".." in text.split("/"):
                    raise refused(f"sandbox: {event} {text!r}: a relative path with '..' is not allowed")
                text = getcwd() + "/" + text
            # The path as the kernel will resolve it, symlinks followed (a realpath without Python helpers).
            pending, resolved, links = text.split("/")[::-1], "", 0
            while pending:
                part = pending.pop()
                if part == "" or part == ".":
                    continue
                if part == "..":
                    resolved = resolved.rpartition("/")[0]
                    continue
                candidate = resolved + "/" + part
                try:
                    mode = lstat(candidate).st_mode
                except os_error:  # missing, or not visible to this uid: taken as written
                    resolved = candidate
                    continue
                if mode & file_type != link_type:
                    resolved = candidate
                    continue
                links += 1
                if links > 40:
                    raise refused(f"sandbox: {event} {text!r}: too many symbolic links")
                target = readlink(candidate)
                if target.startswith("/"):
                    resolved = ""
                pending.extend(target.split("/")[::-1])
            resolved = resolved or "/"
            if kind == "o":
                flags = args[2] if type_of(args[2]) is int_type else write_flags
                roots = writable if flags & write_flags else readable
                if flags & directory_flags:
                    roots = entered
                else:
                    try:  # as the kernel will open it (through /proc/self/fd links too), as this uid
                        if stat(text).st_mode & file_type == directory_type:
                            roots = entered  # a directory descriptor could serve as dir_fd=
                    except os_error:  # nor will the kernel open it
                        pass
            else:
                roots = (writable if kind == "w" else entered if kind == "c" else extension_roots if kind == "x"
                         else readable)
            for root in roots:
                if resolved == root or resolved.startswith(root + "/"):
                    break
            else:
                if kind == "x":
                    raise missing(f"sandbox: loading the extension {text!r} is not allowed")
                raise refused(f"sandbox: {event} {text!r} is not allowed")

    return hook


def run(code: bytes) -> None:
    """Run `code` as `__main__`; exit as `python program.py` would (MemoryError: EXIT_MEMORY)."""
    import sys

    main_module = type(sys)("__main__")
    sys.modules["__main__"] = main_module
    try:
        exec(compile(code, "<program>", "exec"), main_module.__dict__)  # noqa: S102 (running it is the point)
    except MemoryError:
        _print_exception()
        raise SystemExit(EXIT_MEMORY) from None
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 (the program's uncaught error, reported as Python would)
        _print_exception()
        raise SystemExit(1) from None


def _print_exception() -> None:
    import sys
    import traceback

    kind, value, tb = sys.exc_info()
    traceback.print_exception(kind, value, tb.tb_next if tb is not None else None)  # without run()'s frame


def _read_all(fd: int) -> bytes:
    import posix

    posix.lseek(fd, 0, 0)
    chunks = []
    while chunk := posix.read(fd, 1 << 16):
        chunks.append(chunk)
    posix.close(fd)
    return b"".join(chunks)


if __name__ == "__main__":
    main()
