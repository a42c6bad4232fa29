#!/usr/bin/env python3
"""A stand-in for the desktop's lock signals, on a private D-Bus bus, for keybagd's tests.

usage: desktop_lock_standin.py session|system

On the session bus it owns org.freedesktop.ScreenSaver; on the system bus it owns
org.freedesktop.login1 (as logind does). It prints "ready" once the name is its own, then reads
commands from standard input, emits the signal each names, and prints "sent":

    active true|false   org.freedesktop.ScreenSaver.ActiveChanged(b)        (session bus)
    locked true|false   PropertiesChanged of org.freedesktop.login1.Session  (LockedHint)
    sleep true|false    org.freedesktop.login1.Manager.PrepareForSleep(b)

Uses jeepney (pure-Python D-Bus), installed in the test venv by scripts/test.
"""
import sys

from jeepney import DBusAddress, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection


def main():
    bus = sys.argv[1]
    name = "org.freedesktop.ScreenSaver" if bus == "session" else "org.freedesktop.login1"
    conn = open_dbus_connection(bus=bus.upper())
    reply = conn.send_and_get_reply(message_bus.RequestName(name))
    if reply.body[0] != 1:
        print("could not own %s" % name, flush=True)
        return 1
    print("ready", flush=True)
    for line in sys.stdin:
        what, value = line.split()
        flag = value == "true"
        if what == "active":
            address = DBusAddress("/org/freedesktop/ScreenSaver", interface="org.freedesktop.ScreenSaver")
            message = new_signal(address, "ActiveChanged", "b", (flag,))
        elif what == "locked":
            address = DBusAddress("/org/freedesktop/login1/session/auto", interface="org.freedesktop.DBus.Properties")
            message = new_signal(address, "PropertiesChanged", "sa{sv}as",
                                 ("org.freedesktop.login1.Session", {"LockedHint": ("b", flag)}, []))
        elif what == "sleep":
            address = DBusAddress("/org/freedesktop/login1", interface="org.freedesktop.login1.Manager")
            message = new_signal(address, "PrepareForSleep", "b", (flag,))
        else:
            print("unknown command %s" % what, flush=True)
            continue
        conn.send(message)
        print("sent", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
