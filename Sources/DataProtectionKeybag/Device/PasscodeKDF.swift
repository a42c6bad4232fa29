import Crypto
import DataProtectionSystem
import Foundation
import _CryptoExtras

/// scrypt parameters for turning a passcode into key material; stored in the keybag.
///
/// They are calibrated when a keybag is created so that one attempt costs at least
/// ``PasscodeKDF/targetCost`` on that machine (Apple calibrates its PBKDF2 to ~80 ms).
public struct PasscodeKDF: Sendable, Equatable, CustomStringConvertible {
    /// log2 of scrypt's cost parameter N.
    public var logN: UInt8
    /// scrypt's block size r.
    public var r: UInt8
    /// scrypt's parallelism p.
    public var p: UInt8

    /// What one attempt must cost at least: 80 ms, as on iOS.
    public static let targetCost: Duration = .milliseconds(80)

    public init(logN: UInt8, r: UInt8 = 8, p: UInt8 = 1) {
        self.logN = logN
        self.r = r
        self.p = p
    }

    /// Weak parameters (N = 2^10) for tests and the tour's virtual device: *never* for real data.
    @_spi(Testing) public static let insecureFastForTesting = PasscodeKDF(logN: 10)

    public var description: String { "scrypt(N=2^\(logN), r=\(r), p=\(p))" }

    /// Whether the parameters are ones this library accepts when reading a keybag.
    var isPlausible: Bool { (10...22).contains(logN) && (1...32).contains(r) && (1...16).contains(p) }

    /// `scrypt(passcode, salt)`, 32 bytes.
    func derive(passcode: String, salt: [UInt8]) throws -> SymmetricKey {
        try derive(passcode: SecretBytes(utf8: passcode), salt: salt)
    }

    /// `scrypt(passcode, salt)`, reading the passcode in place (no copy), then zeroing the part
    /// of this thread's stack scrypt's HMAC used for its key block.
    func derive(passcode: SecretBytes, salt: [UInt8]) throws -> SymmetricKey {
        defer { SystemCall.scrubStack() }
        return try passcode.withUnsafeBytes { bytes in
            try KDF.Scrypt.deriveKey(
                from: bytes, salt: salt, outputByteCount: 32,
                rounds: 1 << Int(logN), blockSize: Int(r), parallelism: Int(p))
        }
    }

    /// The time one passcode attempt takes with these parameters on this machine.
    public func measureOneAttempt() throws -> Duration {
        let salt = [UInt8](repeating: 0x5a, count: 16)
        return try ContinuousClock().measure { _ = try derive(passcode: "measurement", salt: salt) }
    }

    /// Measures this machine and returns the cheapest parameters whose attempt costs at least
    /// `target`: N doubles from 2^14 up to 2^20 (1 GiB with r = 8), then p grows.
    public static func calibrated(target: Duration = targetCost) throws -> PasscodeKDF {
        var kdf = PasscodeKDF(logN: 14)
        while true {
            let cost = try kdf.measureOneAttempt()
            if cost >= target { return kdf }
            if kdf.logN < 20 { kdf.logN += 1 } else if kdf.p < 16 { kdf.p += 1 } else { return kdf }
        }
    }
}
