#!/usr/bin/env python3
"""A stand-in for logind's sleep inhibitors, on a private D-Bus bus, for the lifecycle tests.

usage: logind_inhibit_standin.py

Owns org.freedesktop.login1 on the bus in DBUS_SYSTEM_BUS_ADDRESS (as logind does on the system
bus) and answers org.freedesktop.login1.Manager.Inhibit(what, who, why, mode) with a file
descriptor, as logind does: the inhibitor lasts until every copy of that descriptor is closed.
Prints "ready" once the name is its own, then one line per event:

    inhibit WHAT|WHO|WHY|MODE     an inhibitor was taken
    released WHAT|WHO|WHY|MODE    its descriptor was closed by the holder

Uses jeepney (pure-Python D-Bus), installed in the test venv by scripts/test.
"""
import os
import select
import sys

from jeepney import MessageType, new_error, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.fds import FileDescriptor
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields


def main():
    conn = open_dbus_connection(bus="SYSTEM", enable_fds=True)
    reply = conn.send_and_get_reply(message_bus.RequestName("org.freedesktop.login1"))
    if reply.body[0] != 1:
        print("could not own org.freedesktop.login1", flush=True)
        return 1
    print("ready", flush=True)
    held = {}   # our end of each inhibitor's pipe -> its description
    while True:
        ready, _, _ = select.select([conn.sock] + list(held), [], [])
        for fd in ready:
            if fd is conn.sock:
                message = conn.receive()
                if message.header.message_type != MessageType.method_call:
                    continue
                member = message.header.fields.get(HeaderFields.member)
                if member == "Inhibit" and message.header.fields.get(HeaderFields.interface) == "org.freedesktop.login1.Manager":
                    ours, theirs = os.pipe()
                    description = "|".join(message.body)
                    held[ours] = description
                    conn.send(new_method_return(message, "h", (FileDescriptor(theirs),)))
                    print("inhibit " + description, flush=True)
                else:
                    conn.send(new_error(message, "org.freedesktop.DBus.Error.UnknownMethod", "s", (str(member),)))
            else:
                os.read(fd, 1)   # end of file: the holder closed its descriptor
                print("released " + held.pop(fd), flush=True)
                os.close(fd)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ConnectionError, KeyboardInterrupt):
        sys.exit(0)   # the private bus went away with its test
