#!/usr/bin/env python3
"""An attacker model for the test suite: someone who can write to a backup repository but holds
no key. Written from docs/FORMAT.md alone (§2b backup keybag, §3 protected files, §5 backups,
backup format 2), with pyca/cryptography and sqlite3.

All it uses is a backup keybag lying in the repository: bytes 12..28 (the keybag UUID that file
headers name) and 212..244 (the class B X25519 public key). With those, anyone can create class-B
protected files, so a forged backup's objects and manifest decrypt; only the `authentication`
file's tag (HMAC under a key the attacker does not have) can tell it from a genuine one.

    backup_forger.py forge REPO --backup-keybag PATH [--id ID] --file RELPATH CONTENT
                     [--file RELPATH2 CONTENT2 ...] [--mode 0o4755]
                     [--authentication none|random|copy-from:BACKUP_DIR]
        creates REPO/backups/ID (and the objects it uses) and prints its path.

RELPATH and CONTENT are taken as bytes (os.fsencode), so invalid UTF-8 passes through.
Errors: one line on stderr, exit status 1.
"""
import argparse
import datetime
import hashlib
import os
import sqlite3
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_format  # noqa: E402  (hkdf, hmac_sha256, file_keys, segment_aad, FILE_MAGIC)

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import aes_key_wrap

BACKUP_KEYBAG_MAGIC = b"\x89DPBK\r\n\x1a"
AUTHENTICATION_MAGIC = b"\x89DPBA\r\n\x1a"
CLASS_B = 2
LOG2_SEGMENT = 16


class ForgeError(Exception):
    pass


# ---- §3: a class-B protected file, from the public key alone ------------------------------

def seal_class_b(plaintext, keybag_uuid_bytes, b_public, log2_segment=LOG2_SEGMENT):
    """A valid class-B protected file (§3) whose plaintext is `plaintext`."""
    if len(keybag_uuid_bytes) != 16 or len(b_public) != 32:
        raise ForgeError("keybag UUID must be 16 bytes and the class B public key 32")
    file_key = os.urandom(32)
    file_id = os.urandom(16)
    ephemeral = X25519PrivateKey.generate()
    e_public = ephemeral.public_key().public_bytes_raw()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(b_public))
    kek = dp_format.hkdf(shared, e_public + b_public, b"DataProtection v1 class B file key wrap")
    wrapped = aes_key_wrap(kek, file_key)  # 40 bytes
    content_key, header_key = dp_format.file_keys(file_key, file_id)
    header = (dp_format.FILE_MAGIC
              + struct.pack(">HHBBBB", 1, 160, CLASS_B, log2_segment, 0, 0)
              + file_id + keybag_uuid_bytes + wrapped + e_public + bytes(8))
    assert len(header) == 128
    header += dp_format.hmac_sha256(header_key, header)
    size = 1 << log2_segment
    chunks = [plaintext[i:i + size] for i in range(0, len(plaintext), size)] or [b""]
    aead = AESGCM(content_key)
    out = bytearray(header)
    for index, chunk in enumerate(chunks):
        nonce = os.urandom(12)
        aad = dp_format.segment_aad(file_id, index, index == len(chunks) - 1)
        out += nonce + aead.encrypt(nonce, chunk, aad)
    return bytes(out)


# ---- §2b: what the attacker reads from a backup keybag ------------------------------------

def read_backup_keybag(path):
    data = open(path, "rb").read()
    if len(data) != 276 or data[:8] != BACKUP_KEYBAG_MAGIC:
        raise ForgeError(f"{path}: not a backup keybag (276 bytes, magic \\x89DPBK)")
    return data, data[12:28], data[212:244]


# ---- §5 (format 2): the forged backup -----------------------------------------------------

def store_object(repo, stored):
    """Writes REPO/objects/XX/SHA256 and returns the name."""
    name = hashlib.sha256(stored).hexdigest()
    directory = os.path.join(repo, "objects", name[:2])
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(stored)
    return name


def manifest_database(meta, entries):
    """The bytes of an SQLite database file with the manifest's tables."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "manifest.sqlite")
        db = sqlite3.connect(path)
        db.executescript("""
            CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE entry(path BLOB PRIMARY KEY, kind TEXT NOT NULL, mode INTEGER NOT NULL,
                mtime DOUBLE NOT NULL, size INTEGER NOT NULL, protectionClass INTEGER,
                sha256 TEXT, linkTarget BLOB, thisDeviceOnly BOOLEAN NOT NULL DEFAULT 0,
                sealed BOOLEAN NOT NULL DEFAULT 0);
        """)
        db.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", sorted(meta.items()))
        db.executemany(
            "INSERT INTO entry(path, kind, mode, mtime, size, protectionClass, sha256, linkTarget,"
            " thisDeviceOnly, sealed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", entries)
        db.commit()
        db.close()  # rollback journal mode: the file is complete once closed
        return open(path, "rb").read()


def authentication_bytes(choice, keybag_uuid):
    """None (omit the file), or the 60 bytes to write."""
    if choice == "none":
        return None
    if choice == "random":  # the right layout, a tag nobody computed
        return AUTHENTICATION_MAGIC + struct.pack(">HH", 1, 60) + keybag_uuid + os.urandom(32)
    if choice.startswith("copy-from:"):  # replay a genuine backup's file
        source = os.path.join(choice[len("copy-from:"):], "authentication")
        try:
            return open(source, "rb").read()
        except OSError as error:
            raise ForgeError(f"cannot read {source}: {error.strerror}")
    raise ForgeError(f"--authentication: expected none, random or copy-from:BACKUP_DIR, not {choice!r}")


def new_backup_id():
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + os.urandom(4).hex()


def forge(repo, keybag_path, files, mode=0o644, backup_id=None, authentication="none",
          source="/home/victim"):
    """Forges REPO/backups/ID holding `files` ([(relpath bytes, content bytes)]); returns its path."""
    keybag, keybag_uuid, b_public = read_backup_keybag(keybag_path)
    auth = authentication_bytes(authentication, keybag_uuid)  # fail before writing anything
    backup_id = backup_id or new_backup_id()
    backup_dir = os.path.join(repo, "backups", backup_id)
    os.makedirs(os.path.join(repo, "objects"), exist_ok=True)
    os.makedirs(backup_dir)  # an existing backup is an error
    now = datetime.datetime.now(datetime.timezone.utc)
    mtime = now.timestamp()
    entries, objects, directories = {}, set(), set()
    for relpath, content in files:
        parts = relpath.split(b"/")
        for depth in range(1, len(parts)):  # a directory entry for every parent
            parent = b"/".join(parts[:depth])
            if parent and parent not in directories:
                directories.add(parent)
                entries[parent] = (parent, "directory", 0o755, mtime, 0, None, None, None, 0, 0)
        name = store_object(repo, seal_class_b(content, keybag_uuid, b_public))
        objects.add(name)
        entries[relpath] = (relpath, "file", mode, mtime, len(content), None, name, None, 0, 1)
    meta = {"format": "2", "source": source, "created": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "id": backup_id}
    database = manifest_database(meta, list(entries.values()))
    with open(os.path.join(backup_dir, "manifest.sealed"), "wb") as f:
        f.write(seal_class_b(database, keybag_uuid, b_public))
    with open(os.path.join(backup_dir, "objects.list"), "w") as f:
        f.write("".join(name + "\n" for name in sorted(objects)))
    with open(os.path.join(backup_dir, "backup-keybag"), "wb") as f:
        f.write(keybag)  # the genuine one: the forgery names its UUID and public key
    if auth is not None:
        with open(os.path.join(backup_dir, "authentication"), "wb") as f:
            f.write(auth)
    return backup_dir


# ---- command line -------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 1 (argparse's default is usage + exit 2)
        raise ForgeError(message)


def parse_mode(text):
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a mode: {text!r} (e.g. 0o4755)")


def main(argv):
    parser = Parser(prog="backup_forger.py", description="Forge a backup with no key.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    f = commands.add_parser("forge", help="create a forged backup in REPO")
    f.add_argument("repo")
    f.add_argument("--backup-keybag", required=True)
    f.add_argument("--id")
    f.add_argument("--file", nargs=2, action="append", required=True,
                   metavar=("RELPATH", "CONTENT"))
    f.add_argument("--mode", type=parse_mode, default=0o644)
    f.add_argument("--source", default="/home/victim")
    f.add_argument("--authentication", nargs="+", default=["none"], metavar="CHOICE",
                   help="none (default), random, or copy-from:BACKUP_DIR")
    args = parser.parse_args(argv)
    auth = args.authentication
    if len(auth) == 2 and auth[0] == "copy-from":  # also accept "copy-from BACKUP_DIR"
        auth = ["copy-from:" + auth[1]]
    if len(auth) != 1:
        raise ForgeError("--authentication takes none, random or copy-from:BACKUP_DIR")
    # Not validated on purpose: empty, absolute or ".." paths are attacks to try.
    files = [(os.fsencode(path), os.fsencode(content)) for path, content in args.file]
    print(forge(args.repo, args.backup_keybag, files, args.mode, args.id, auth[0], args.source))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as error:  # one line, exit 1: the Swift tests read it
        message = str(error).replace("\n", " ")
        print(f"backup_forger.py: {type(error).__name__}: {message}", file=sys.stderr)
        sys.exit(1)
