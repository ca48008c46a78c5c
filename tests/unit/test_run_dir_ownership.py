"""A run directory nobody else can steer (safe_files.py, launch/elastic/control_channel.py,
observe/run_records/run_dir.py): refused when another user owns it or may write it; files planted as
another user (``setpriv`` to uid 65534 in a directory opened to it, then closed again) are
never followed; control requests that are no regular file are refused and the launcher's
poll goes on."""
import json
import os
import re
import shutil
import stat
import subprocess
import threading

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.elastic.control_channel import ControlChannel
from paramshard.observe.run_records.run_dir import RunDir
from paramshard.safe_files import UnsafeFile, check_private_dir

NOBODY = 65534
can_switch_user = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                     reason="planting files as another user needs root and setpriv")


def as_nobody(*argv):
    """Run ``argv`` as uid/gid 65534, with no supplementary groups."""
    subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *argv], check=True)


def plant(folder, *argv):
    """``argv`` run as another user in ``folder``, opened to every user only meanwhile."""
    mode = stat.S_IMODE(os.stat(folder).st_mode)
    parents = [p for p in folder.parents if stat.S_IMODE(os.stat(p).st_mode) & 0o001 == 0]
    for p in parents:                      # pytest's tmp dirs are 0700: let the other user reach ``folder``
        os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) | 0o001)
    os.chmod(folder, 0o777)
    try:
        as_nobody(*argv)
    finally:
        os.chmod(folder, mode)
        for p in reversed(parents):
            os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o001)


class Rank:
    name = "server 0"


# -- the directory itself ----------------------------------------------------------------
@pytest.mark.parametrize("mode, who", [(0o777, "its group and by every user"), (0o775, "its group (mode 0775)"),
                                       (0o757, "every user (mode 0757)")])
def test_a_run_directory_others_may_write_is_refused_saying_which_and_how_to_fix(tmp_path, mode, who):
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, mode)
    with pytest.raises(ConfigError, match=f"writable by {re.escape(who)}.*chmod go-w {re.escape(str(run))}"):
        RunDir(run, "job-x")
    with pytest.raises(ConfigError, match="writable by"):
        ControlChannel(run)
    assert list(run.iterdir()) == []            # refused before anything was written


@can_switch_user
def test_a_run_directory_of_another_user_is_refused(tmp_path):
    plant(tmp_path, "mkdir", "-m", "0755", str(tmp_path / "theirs"))
    assert os.stat(tmp_path / "theirs").st_uid == NOBODY
    with pytest.raises(ConfigError, match=r"belongs to uid 65534.*not to you.*directory of your own"):
        RunDir(tmp_path / "theirs", "job-x")
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        ControlChannel(tmp_path / "theirs")


def test_a_run_directory_made_under_a_loose_umask_is_still_the_users_alone(tmp_path):
    old = os.umask(0o002)
    try:
        RunDir(tmp_path / "runs" / "new", "job-x").close()
    finally:
        os.umask(old)
    for folder in ("new", "new/logs"):
        check_private_dir(tmp_path / "runs" / folder)       # what the next launch into it checks


# -- files planted as another user --------------------------------------------------------
@can_switch_user
def test_a_reply_temporary_file_planted_as_a_link_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    control = tmp_path / "run" / "control"
    control.mkdir(parents=True)
    os.chmod(tmp_path / "run", 0o755)
    plant(control, "ln", "-s", str(victim), str(control / ".reply-ab12.json.tmp"))
    (control / "request-ab12.json").write_text(json.dumps({"kind": "trainers", "value": 3}))
    channel = ControlChannel(tmp_path / "run", {"trainers": lambda n: f"now {n}"})
    assert channel.poll() == 1
    assert victim.read_text() == "the user's own file\n"
    assert json.loads((control / "reply-ab12.json").read_text()) == {"ok": True, "message": "now 3"}


@can_switch_user
def test_a_log_file_planted_as_a_link_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    os.chmod(run, 0o755)
    plant(run / "logs", "ln", "-s", str(victim), str(run / "logs" / "server-0.log"))
    watch = RunDir(run, "job-x")
    with pytest.raises(UnsafeFile, match=r"server-0.log is a symbolic link"):
        tap = watch.tap_for(Rank())
        tap("a line the server prints\n")           # the old code wrote it into the victim
    watch.close()
    assert victim.read_text() == "the user's own file\n"


@can_switch_user
def test_a_log_file_of_another_user_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    os.chmod(run, 0o755)
    plant(run / "logs", "touch", str(run / "logs" / "server-0.log"))
    watch = RunDir(run, "job-x")
    with pytest.raises(UnsafeFile, match=r"server-0.log belongs to uid 65534"):
        watch.tap_for(Rank())
    watch.close()


# -- control requests that are no file ------------------------------------------------------
def _poll_within(channel, seconds=20.0):
    """The launcher's poll, in a thread: a poll blocked for good (the old code on a FIFO) fails
    the test instead of hanging it."""
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("n", channel.poll()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the control poll blocked"
    return done["n"]


def _hostile(tmp_path, make):
    control = tmp_path / "control"
    control.mkdir()
    make(control / "request-bad1.json")
    (control / "request-good1.json").write_text(json.dumps({"kind": "trainers", "value": 2}))
    return ControlChannel(tmp_path, {"trainers": lambda n: f"now {n}"}), control


@pytest.mark.parametrize("what, make", [
    ("a FIFO", os.mkfifo),
    ("a directory", lambda p: p.mkdir()),
    ("a symbolic link", lambda p: p.symlink_to("/dev/zero")),
])
def test_a_request_that_is_no_regular_file_is_refused_and_the_poll_goes_on(tmp_path, caplog, what, make):
    channel, control = _hostile(tmp_path, make)
    fifo = control / "request-bad1.json"
    try:
        assert _poll_within(channel) == 1                # the real request only
    finally:
        if what == "a FIFO" and fifo.exists():           # the old code's blocked open: let it end
            with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "w"):
                pass
    assert json.loads((control / "reply-good1.json").read_text()) == {"ok": True, "message": "now 2"}
    assert not os.path.lexists(control / "request-bad1.json")        # removed: not refused again each poll
    assert not (control / "reply-bad1.json").exists()               # nobody waits for it
    assert f"request-bad1.json is {what}" in caplog.text and "the job goes on" in caplog.text
    assert _poll_within(channel) == 0


def test_a_directory_request_that_cannot_be_removed_is_ignored_and_warned_about_once(tmp_path, caplog):
    channel, control = _hostile(tmp_path, lambda p: (p.mkdir(), (p / "x").write_text("x")))
    assert _poll_within(channel) == 1
    assert _poll_within(channel) == 0
    assert caplog.text.count("request-bad1.json is a directory") == 1
    (control / "request-good2.json").write_text(json.dumps({"kind": "trainers", "value": 3}))
    assert _poll_within(channel) == 1                    # still watching
    assert json.loads((control / "reply-good2.json").read_text())["message"] == "now 3"
