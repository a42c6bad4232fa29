#!/usr/bin/env python3
"""An independent reader of the DataProtection formats, written from docs/FORMAT.md alone.

It uses pyca/cryptography (OpenSSL) for every primitive, so the Swift tests can ask a second
implementation whether what the library writes is what the specification says.

    dp_format.py decrypt ROOT FILE [--passcode P]   plaintext of a protected file to stdout
    dp_format.py keybag ROOT                        the keybag's fields, as JSON
    dp_format.py vectors                            recompute the FORMAT.md test vectors, as JSON
    dp_format.py backup-decrypt BACKUP_KEYBAG PASSWORD FILE
                                                    plaintext using only a backup keybag and its password
"""
import json
import struct
import sys
import uuid

from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from cryptography.hazmat.primitives.keywrap import aes_key_unwrap, aes_key_wrap

KEYBAG_MAGIC = b"\x89DPKB\r\n\x1a"
FILE_MAGIC = b"\x89DPF\r\n\x1a\n"


class FormatError(Exception):
    pass


def hkdf(ikm, salt, info, length=32):
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt or None, info=info).derive(ikm)


def hmac_sha256(key, data):
    h = hmac.HMAC(key, hashes.SHA256())
    h.update(data)
    return h.finalize()


def scrypt(passcode, salt, log_n, r, p):
    return Scrypt(salt=salt, length=32, n=1 << log_n, r=r, p=p).derive(passcode.encode())


# ---- keybag -------------------------------------------------------------------------------

def parse_keybag(data, secret):
    # Version 1: 424 bytes; version 2: 504 (the same 392 bytes, an 80-byte extension, the MAC);
    # version 3: version 2 with byte 33 the passcode policy's minimum length.
    if len(data) not in (424, 504) or data[:8] != KEYBAG_MAGIC:
        raise FormatError("not a keybag")
    version, length = struct.unpack(">HH", data[8:12])
    if (version, length) not in ((1, 424), (2, 504), (3, 504)) or length != len(data):
        raise FormatError("bad version/length")
    body = len(data) - 32
    mac_key = hkdf(secret, b"", b"DataProtection v1 keybag MAC")
    if hmac_sha256(mac_key, data[:body]) != data[body:]:
        raise FormatError("keybag MAC")
    if version >= 2 and data[400] != 0:
        raise FormatError("device secret sealed by a TPM: this reader takes a device.secret file")
    flags, kdf_id, log_n, r, p = data[28], data[29], data[30], data[31], data[32]
    kb = {
        "uuid": str(uuid.UUID(bytes=data[12:28])).upper(),
        "passcode_set": bool(flags & 1),
        "erase_after_ten": bool(flags & 2),
        "kdf": {"id": kdf_id, "logN": log_n, "r": r, "p": p},
        "salt": data[36:52],
        "failed_attempts": struct.unpack(">I", data[52:56])[0],
        "last_failure_ms": struct.unpack(">q", data[56:64])[0],
        "grace_ms": struct.unpack(">I", data[80:84])[0],
        "minimum_passcode_length": data[33] if version == 3 else 6,
        "records": {},
    }
    for i in range(4):
        rec = data[88 + 76 * i: 88 + 76 * (i + 1)]
        kb["records"][rec[0]] = {"wrap": rec[1], "wrapped": rec[4:44], "public": rec[44:76]}
    return kb


def class_keys(kb, secret, passcode):
    """Unwraps the class keys: {1: A, 2: B private, 3: C, 4: D}."""
    d_kek = hkdf(secret, b"", b"DataProtection v1 class D KEK")
    keys = {4: aes_key_unwrap(d_kek, kb["records"][4]["wrapped"])}
    if kb["passcode_set"]:
        if passcode is None:
            return keys
        k = kb["kdf"]
        stretched = scrypt(passcode, kb["salt"], k["logN"], k["r"], k["p"])
        kek = hkdf(secret, stretched, b"DataProtection v1 class KEK with passcode")
    else:
        kek = hkdf(secret, b"", b"DataProtection v1 class KEK without passcode")
    for cls in (1, 2, 3):
        keys[cls] = aes_key_unwrap(kek, kb["records"][cls]["wrapped"])
    return keys


# ---- backup keybag -----------------------------------------------------------------------

BACKUP_MAGIC = b"\x89DPBK\r\n\x1a"


def backup_class_keys(data, password):
    if len(data) != 276 or data[:8] != BACKUP_MAGIC:
        raise FormatError("not a backup keybag")
    version, length = struct.unpack(">HH", data[8:12])
    if version != 1 or length != 276:
        raise FormatError("bad version/length")
    salt = data[28:44]
    log_n, r, p = data[44], data[45], data[46]
    stretched = scrypt(password, salt, log_n, r, p)
    kek = hkdf(stretched, b"", b"DataProtection v1 backup keybag KEK")
    mac_key = hkdf(stretched, b"", b"DataProtection v1 backup keybag MAC")
    if hmac_sha256(mac_key, data[:244]) != data[244:]:
        raise FormatError("backup keybag MAC (wrong password?)")
    keys = {}
    for i in range(4):
        rec = data[48 + 41 * i: 48 + 41 * (i + 1)]
        keys[rec[0]] = aes_key_unwrap(kek, rec[1:41])
    return keys, data[212:244]


# ---- protected files ----------------------------------------------------------------------

def file_keys(file_key, file_id):
    return (hkdf(file_key, file_id, b"DataProtection v1 content"),
            hkdf(file_key, file_id, b"DataProtection v1 header"))


def segment_aad(file_id, index, final):
    return file_id + struct.pack(">QB", index, 1 if final else 0)


def device_bound(kek, secret):
    """"This device only" file keys: the KEK is tied to the device secret as well."""
    if secret is None:
        raise FormatError("this file is bound to its device: the device secret is needed")
    salt = hkdf(secret, b"", b"DataProtection v1 this device only")
    return hkdf(kek, salt, b"DataProtection v1 this device only KEK")


def unwrap_file_key(header, keys, b_public, secret=None):
    cls = header[12]
    device_only = header[14] & 1
    wrapped = header[48:88]
    if cls == 2:
        ephemeral = header[88:120]
        shared = X25519PrivateKey.from_private_bytes(keys[2]).exchange(X25519PublicKey.from_public_bytes(ephemeral))
        kek = hkdf(shared, ephemeral + b_public, b"DataProtection v1 class B file key wrap")
    else:
        kek = keys[cls]
    if device_only:
        kek = device_bound(kek, secret)
    return aes_key_unwrap(kek, wrapped)


def segment_starts(version, log2):
    """Plaintext capacities of segment 0 and the others, and where segment i starts on disk
    (FORMAT.md §3: format 1 back to back; format 2 page-aligned, segment 0 after the header)."""
    unit = 1 << log2
    first, cap = (unit, unit) if version == 1 else (unit - 188, unit - 28)
    def start(i):
        return 160 if i == 0 else 160 + first + 28 + (i - 1) * (cap + 28)
    return first, cap, start


def split_segments(length, version, log2):
    """The (offset, sealed length) of each segment of a file `length` bytes long."""
    first, cap, start = segment_starts(version, log2)
    out, i = [], 0
    while True:
        begin = start(i)
        size = (first if i == 0 else cap) + 28
        if begin + size >= length:
            if length - begin < 28:
                raise FormatError("segment cut inside its nonce or tag")
            out.append((begin, length - begin))
            return out
        out.append((begin, size))
        i += 1


def file_length(plain, version, log2):
    """The length on disk of a file of `plain` plaintext bytes."""
    first, cap, start = segment_starts(version, log2)
    last = 0 if plain <= first else 1 + (plain - first - 1) // cap
    before = 0 if last == 0 else first + (last - 1) * cap
    return start(last) + (plain - before) + 28


def decrypt_file(data, keys, b_public, secret=None):
    if data[:8] != FILE_MAGIC:
        raise FormatError("not a protected file")
    version, hlen = struct.unpack(">HH", data[8:12])
    if version not in (1, 2) or hlen != 160:
        raise FormatError("bad version/length")
    header = data[:160]
    log2, flags = header[13], header[14]
    if flags & ~(1 if version == 1 else 7):
        raise FormatError("unknown flags")
    truncating = struct.unpack(">Q", header[120:128])[0]
    if not flags & 4 and truncating != 0:
        raise FormatError("reserved bytes not zero")
    file_id = header[16:32]
    file_key = unwrap_file_key(header, keys, b_public, secret)
    content_key, header_key = file_keys(file_key, file_id)
    if hmac_sha256(header_key, header[:128]) != header[128:160]:
        raise FormatError("header MAC")
    aead = AESGCM(content_key)

    def read(length, last_may_be_open):
        segments = split_segments(length, version, log2)
        out = bytearray()
        for i, (begin, size) in enumerate(segments):
            seg = data[begin:begin + size]
            final = i == len(segments) - 1
            try:
                out += aead.decrypt(seg[:12], seg[12:], segment_aad(file_id, i, final))
            except Exception:
                if not (final and last_may_be_open):
                    raise
                out += aead.decrypt(seg[:12], seg[12:], segment_aad(file_id, i, False))
        return bytes(out)

    if flags & 4 and file_length(truncating, version, log2) <= len(data):
        # A truncation under way (flag bit 2): the file as it was being cut to, if its new final
        # segment is there.
        try:
            return read(file_length(truncating, version, log2), False)
        except Exception:
            pass
    # Being written (flag bit 1): a write cut short may have left the last segment non-final.
    return read(len(data), bool(flags & 2))


# ---- test vectors -------------------------------------------------------------------------

def vectors():
    secret = bytes(range(0x00, 0x20))
    salt = bytes(range(0x00, 0x10))
    stretched = scrypt("1234", salt, 10, 8, 1)
    file_key = bytes(range(0x40, 0x60))
    file_id = bytes(range(0x60, 0x70))
    class_key = bytes(range(0x80, 0xA0))
    nonce = bytes(range(0x00, 0x0C))
    keybag_id = uuid.UUID("00112233-4455-6677-8899-AABBCCDDEEFF").bytes
    content_key, header_key = file_keys(file_key, file_id)
    wrapped = aes_key_wrap(class_key, file_key)
    header = (FILE_MAGIC + struct.pack(">HHBBH", 1, 160, 3, 16, 0) + file_id + keybag_id + wrapped
              + bytes(32) + bytes(8))
    header += hmac_sha256(header_key, header)
    plaintext = b"hello, data protection"
    sealed = nonce + AESGCM(content_key).encrypt(nonce, plaintext, segment_aad(file_id, 0, True))
    b_private = bytes(range(0xA0, 0xC0))
    ephemeral = bytes(range(0xC0, 0xE0))
    b_public = X25519PrivateKey.from_private_bytes(b_private).public_key().public_bytes_raw()
    e_public = X25519PrivateKey.from_private_bytes(ephemeral).public_key().public_bytes_raw()
    shared = X25519PrivateKey.from_private_bytes(ephemeral).exchange(X25519PublicKey.from_public_bytes(b_public))
    b_kek = hkdf(shared, e_public + b_public, b"DataProtection v1 class B file key wrap")
    header_v2 = (FILE_MAGIC + struct.pack(">HHBBBB", 2, 160, 3, 12, 0, 0) + file_id + keybag_id + wrapped
                 + bytes(32) + bytes(8))
    header_v2 += hmac_sha256(header_key, header_v2)
    header_v2_cut = (FILE_MAGIC + struct.pack(">HHBBBB", 2, 160, 3, 12, 6, 0) + file_id + keybag_id + wrapped
                     + bytes(32) + struct.pack(">Q", 5000))
    header_v2_cut += hmac_sha256(header_key, header_v2_cut)
    return {
        "header_v2": header_v2.hex(),
        "header_v2_truncating": header_v2_cut.hex(),
        "keybag_mac_key": hkdf(secret, b"", b"DataProtection v1 keybag MAC").hex(),
        "class_d_kek": hkdf(secret, b"", b"DataProtection v1 class D KEK").hex(),
        "no_passcode_kek": hkdf(secret, b"", b"DataProtection v1 class KEK without passcode").hex(),
        "scrypt_1234": stretched.hex(),
        "passcode_kek": hkdf(secret, stretched, b"DataProtection v1 class KEK with passcode").hex(),
        "failed_tag_key": hkdf(secret, b"", b"DataProtection v1 failed passcode tag").hex(),
        "content_key": content_key.hex(),
        "header_key": header_key.hex(),
        "wrapped_file_key": wrapped.hex(),
        "header": header.hex(),
        "segment_aad": segment_aad(file_id, 0, True).hex(),
        "segment": sealed.hex(),
        "class_b_public": b_public.hex(),
        "class_b_ephemeral_public": e_public.hex(),
        "class_b_kek": b_kek.hex(),
        "class_b_wrapped_file_key": aes_key_wrap(b_kek, file_key).hex(),
    }


def main(argv):
    if len(argv) >= 2 and argv[1] == "vectors":
        print(json.dumps(vectors(), indent=2))
        return 0
    if len(argv) == 5 and argv[1] == "backup-decrypt":
        keys, b_public = backup_class_keys(open(argv[2], "rb").read(), argv[3])
        sys.stdout.buffer.write(decrypt_file(open(argv[4], "rb").read(), keys, b_public))
        return 0
    if len(argv) >= 3 and argv[1] in ("decrypt", "keybag"):
        root = argv[2]
        secret = open(root + "/device.secret", "rb").read()
        kb = parse_keybag(open(root + "/keybag", "rb").read(), secret)
        if argv[1] == "keybag":
            printable = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in kb.items() if k != "records"}
            print(json.dumps(printable, indent=2))
            return 0
        passcode = argv[argv.index("--passcode") + 1] if "--passcode" in argv else None
        keys = class_keys(kb, secret, passcode)
        data = open(argv[3], "rb").read()
        sys.stdout.buffer.write(decrypt_file(data, keys, kb["records"][2]["public"], secret))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exception as error:  # one line, non-zero: the Swift test reads it
        print(f"dp_format.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
