"""Settings and checks every test shares."""

import dataclasses
import faulthandler
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

SUPPORT_MODULE = "pasu_tests_cloud_support"

# A hard crash (abort, segfault) ends pytest before it reports anything, and CI keeps only the end of the
# output, where the stacks of the pytest frames push out the test's own. So the test in progress and every
# thread's stack go to this file, which `make test` prints first on failure; a clean run removes it.
CRASH_LOG = Path(os.environ.get("PASU_TEST_CRASH_LOG", ".pytest-crash.log"))
_crash_file = None


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin, which points it at stderr
def pytest_configure(config: pytest.Config) -> None:
    global _crash_file
    _crash_file = CRASH_LOG.open("w")
    faulthandler.enable(file=_crash_file, all_threads=True)
    # Module- and session-scoped fixtures are set up before the autouse `one_thread`: they too must compute with
    # one thread, or a test comparing its own result with a fixture's exactly sees float sums that differ
    # between thread counts (tests/device/test_search.py did, on a 2-core machine whose default is 2).
    torch.set_num_threads(1)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _crash_file.seek(0)
    _crash_file.truncate()
    _crash_file.write(f"test in progress: {nodeid}\n")
    _crash_file.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.disable()
    _crash_file.close()
    CRASH_LOG.unlink(missing_ok=True)


def _load_cloud_support() -> None:
    """tests/cloud/support.py (the tiny real ASR model, recognizer, certificates, servers) as one module named
    SUPPORT_MODULE. This conftest loads before every test module, so tests `import pasu_tests_cloud_support`
    (the tests folder is not a package in importlib mode) or take the `cloud_support` fixture."""
    if SUPPORT_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(SUPPORT_MODULE, Path(__file__).parent / "cloud" / "support.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[SUPPORT_MODULE] = module
        spec.loader.exec_module(module)


_load_cloud_support()


@pytest.fixture(scope="session")
def cloud_support():
    """tests/cloud/support.py."""
    return sys.modules[SUPPORT_MODULE]


@pytest.fixture
def start_server(cloud_support):
    """start_server(recognizer=None, **ServerConfig fields) -> a started in-process ServerThread on 127.0.0.1 with
    a free port, stopped at teardown (the cloud and the device tests' real server)."""
    from pasu.cloud.config import ServerConfig
    from pasu.cloud.server import ServerThread

    started = []

    def start(recognizer=None, **config):
        # text_intent: the recognizer's own answers, whether or not a classifier ships (tests opt in)
        config = {"host": "127.0.0.1", "port": 0, "metrics_port": None, "shutdown_grace_s": 0.0, "text_intent": None,
                  **config}
        server = ServerThread(recognizer or cloud_support.tiny_recognizer(), ServerConfig(**config)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace=0)


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: the 2-core machine is often shared with a training job, and train() uses one too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- Shipped configuration files (device/agent.yaml, cloud/server.yaml) ------------------------------------

_YAML_KEY = re.compile(r"^(\s*)([A-Za-z_]\w*):")


@pytest.fixture
def template_problems():
    """problems(path, defaults): how a shipped config YAML falls short of documenting `defaults` (a dataclass
    instance): keys that are no field, fields with no key, keys with no comment (on their line or just above)."""
    return _template_problems


def _template_problems(path: Path, defaults: object) -> list[str]:
    keys, problems = set(), []
    parents: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    previous = ""
    for line in path.read_text().splitlines():
        if match := _YAML_KEY.match(line):
            indent, key = len(match[1]), match[2]
            parents = [p for p in parents if p[0] < indent] + [(indent, key)]
            name = ".".join(k for _, k in parents)
            keys.add(name)
            if "#" not in line and not previous.lstrip().startswith("#"):
                problems.append(f"{name}: no comment")
        previous = line if line.strip() else previous
    fields = set(_field_names(defaults))
    return (problems + [f"{k}: no such field" for k in sorted(keys - fields)]
            + [f"{f}: missing" for f in sorted(fields - keys)])


def _field_names(obj: object, prefix: str = ""):
    """Dotted names of a dataclass instance's fields, nested sections and their fields included."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        yield prefix + f.name
        if dataclasses.is_dataclass(value):
            yield from _field_names(value, f"{prefix}{f.name}.")


# A dozen labelled commands: enough for a TF-IDF intent reader (models/intent_reader.py) to tell three intents.
COMMANDS = {
    "wake me up at seven": "alarm_set", "set an alarm for six am": "alarm_set", "alarm at nine please": "alarm_set",
    "set an alarm for noon": "alarm_set", "play some jazz": "play_music", "play my rock playlist": "play_music",
    "put on some music": "play_music", "play the new album": "play_music", "what is the weather today": "weather_query",
    "will it rain tomorrow": "weather_query", "is it cold outside": "weather_query", "weather in paris": "weather_query",
}


@pytest.fixture
def commands() -> dict[str, str]:
    """COMMANDS: text -> intent, the first four alarm_set, the next four play_music."""
    return dict(COMMANDS)


@pytest.fixture
def small_reader(commands):
    """A TF-IDF intent reader fitted on `commands` (every n-gram kept: they are few)."""
    from pasu.models.intent_reader import IntentReader, ReaderOptions

    return IntentReader.fit(list(commands), list(commands.values()), ReaderOptions(min_df=1))

