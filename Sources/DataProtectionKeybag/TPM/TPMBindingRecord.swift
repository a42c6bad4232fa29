import Crypto
import DataProtectionSystem
import Foundation

/// `ROOT/device.tpm`: where the TPM keeps this root's device secret, in place of the clear
/// `device.secret` file (FORMAT.md §2c). 32 bytes, written once at enrollment.
///
/// It is read before anything can be authenticated (the keybag's MAC key is derived from the
/// secret it locates), so it holds only what is needed to find and unseal that secret; the
/// keybag then authenticates it by its SHA-256 (``KeybagTPMFields/bindingDigest``). A record
/// pointing elsewhere yields another secret, and the keybag's MAC rejects it.
struct TPMBindingRecord: Sendable, Equatable {
    static let fileName = "device.tpm"
    static let magic: [UInt8] = [0x89, 0x44, 0x50, 0x54, 0x50, 0x4D, 0x0D, 0x0A]   // \x89 D P T P M \r \n
    static let version: UInt16 = 1
    static let size = 32

    /// The persistent handle (0x81xxxxxx) of the object sealing the device secret.
    var deviceObject: UInt32
    /// The PCRs (SHA-256 bank) every object of this root is bound to, if any.
    var pcrs: TPMPCRSelection?

    var encoded: [UInt8] {
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u16(Self.version)
        w.u16(0)   // flags: none defined
        w.u32(deviceObject)
        w.u16(0x000B)   // TPM_ALG_SHA256: the PCR bank
        w.u16(0)
        w.u32(pcrs?.mask ?? 0)
        w.zeros(8)
        return w.bytes
    }

    var digest: [UInt8] { Array(SHA256.hash(data: encoded)) }

    static func decode(_ bytes: [UInt8], path: String) throws -> TPMBindingRecord {
        func reject(_ why: String) -> KeybagError { .badDeviceSecret("\(path): \(why)") }
        guard bytes.count == size else { throw reject("\(bytes.count) bytes, expected \(size)") }
        guard Array(bytes[0..<8]) == magic else { throw reject("not a DataProtection TPM binding (bad magic)") }
        var r = ByteReader(bytes)
        do {
            _ = try r.raw(8, "magic")
            let version = try r.u16("version")
            guard version == Self.version else {
                throw reject("version \(version) is not supported (this build reads \(Self.version))")
            }
            guard try r.u16("flags") == 0 else { throw reject("unknown flags") }
            let object = try r.u32("device object")
            guard object >> 24 == 0x81 else {
                throw reject("device object 0x\(String(object, radix: 16)) is not a persistent handle")
            }
            guard try r.u16("bank") == 0x000B, try r.u16("reserved") == 0 else { throw reject("unsupported PCR bank") }
            let mask = try r.u32("PCR mask")
            guard mask <= 0xFF_FFFF else { throw reject("PCR mask beyond PCR 23") }
            guard try r.raw(8, "reserved").allSatisfy({ $0 == 0 }) else { throw reject("reserved bytes not zero") }
            return TPMBindingRecord(deviceObject: object, pcrs: mask == 0 ? nil : TPMPCRSelection(mask: mask))
        } catch let error as ByteReader.OutOfBounds {
            throw reject("truncated at \(error.field)")
        }
    }
}
