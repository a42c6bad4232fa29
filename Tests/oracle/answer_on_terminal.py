#!/usr/bin/env python3
"""Runs a command on a pseudo-terminal of its own and answers its prompts as a person would.

    answer_on_terminal.py PROMPT=ANSWER [PROMPT=ANSWER ...] -- COMMAND [ARGS ...]

The command gets the terminal as its controlling terminal (pty.fork makes it a session leader),
so it asks on /dev/tty as it would for a person. Each ANSWER is typed, with Enter, only once its
PROMPT has appeared: a prompt that turns echo off flushes what was typed before it. Prints all
the command wrote to the terminal; exits with its status (or 124 when it waits more than 60 s
for a prompt or its end, the safety limit of a hung command, not a pause).
"""
import os
import pty
import select
import sys

separator = sys.argv.index("--")
pairs = [argument.split("=", 1) for argument in sys.argv[1:separator]]
command = sys.argv[separator + 1:]

pid, fd = pty.fork()
if pid == 0:
    os.execvp(command[0], command)

transcript = b""
searched_from = 0
answered = 0
timed_out = False
while True:
    ready, _, _ = select.select([fd], [], [], 60)
    if not ready:
        timed_out = True
        os.kill(pid, 9)
        break
    try:
        chunk = os.read(fd, 4096)
    except OSError:   # EIO: the command closed the terminal (it ended)
        break
    if not chunk:
        break
    transcript += chunk
    while answered < len(pairs):
        prompt, answer = pairs[answered]
        found = transcript.find(prompt.encode(), searched_from)
        if found < 0:
            break
        searched_from = found + len(prompt)
        os.write(fd, answer.encode() + b"\n")
        answered += 1

_, status = os.waitpid(pid, 0)
sys.stdout.write(transcript.decode("utf-8", "replace"))
if timed_out:
    sys.exit(124)
sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
