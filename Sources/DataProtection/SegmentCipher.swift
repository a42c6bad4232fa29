import Crypto
import Foundation

/// Seals and opens the AES-256-GCM segments of one protected file.
///
/// On disk a segment is `nonce (12) ‖ ciphertext ‖ tag (16)`; the nonce is random and fresh
/// for every write of the segment, so rewriting a segment never reuses one. The associated
/// data binds the segment to its file and its position: `file ID (16) ‖ index (u64 BE) ‖
/// final (u8)`, where `final` is 1 only for the file's last segment. So flipping, swapping
/// between files, reordering, truncating and extending are all detected.
struct SegmentCipher: Sendable {
    static let overhead = 28   // nonce + tag

    let key: SymmetricKey
    let fileID: [UInt8]

    func associatedData(index: Int, final: Bool) -> [UInt8] {
        var w = ByteWriter()
        w.raw(fileID)
        w.u64(UInt64(index))
        w.u8(final ? 1 : 0)
        return w.bytes
    }

    /// Appends the sealed segment to `output`.
    func seal(_ plaintext: UnsafeRawBufferPointer, index: Int, final: Bool, nonce: AES.GCM.Nonce = AES.GCM.Nonce(),
              into output: inout [UInt8]) throws {
        let box = try AES.GCM.seal(plaintext, using: key, nonce: nonce, authenticating: associatedData(index: index, final: final))
        // A 12-byte nonce always gives a combined representation.
        output.append(contentsOf: box.combined!)
    }

    /// Opens one sealed segment; `nil` when it does not authenticate as segment `index` with
    /// that `final` flag.
    func open(_ sealed: ArraySlice<UInt8>, index: Int, final: Bool) -> Data? {
        guard sealed.count >= Self.overhead,
              let box = try? AES.GCM.SealedBox(combined: sealed),
              let plain = try? AES.GCM.open(box, using: key, authenticating: associatedData(index: index, final: final))
        else { return nil }
        return plain
    }
}
