import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

/// Mutation fuzzing kept as a test (the review's 29,000 mutated files found nothing; these keep
/// it that way): every mutation of a protected file reads as an error or as exactly the original
/// plaintext, never as other bytes, and never traps.
@Suite struct ParserFuzzTests {
    /// A deterministic generator, so a failure can be replayed from its seed.
    struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// Flips, overwrites, insertions, deletions, truncations, extensions and splices.
    static func mutate(_ original: [UInt8], _ rng: inout SplitMix) -> [UInt8] {
        var bytes = original
        for _ in 0..<Int.random(in: 1...3, using: &rng) {
            guard !bytes.isEmpty else { bytes = [UInt8.random(in: 0...255, using: &rng)]; continue }
            let at = Int.random(in: 0..<bytes.count, using: &rng)
            switch Int.random(in: 0..<7, using: &rng) {
            case 0: bytes[at] ^= 1 << UInt8.random(in: 0...7, using: &rng)
            case 1: bytes[at] = UInt8.random(in: 0...255, using: &rng)
            case 2: bytes.insert(UInt8.random(in: 0...255, using: &rng), at: at)
            case 3: bytes.remove(at: at)
            case 4: bytes = Array(bytes.prefix(at))
            case 5: bytes += (0..<Int.random(in: 1...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            default:
                let length = min(Int.random(in: 1...200, using: &rng), bytes.count - at)
                let from = Int.random(in: 0..<bytes.count, using: &rng)
                let chunk = bytes[from..<min(bytes.count, from + length)]
                bytes.replaceSubrange(at..<at + min(length, chunk.count), with: chunk)
            }
        }
        return bytes
    }

    @Test func twoThousandMutatedProtectedFilesNeverReadAsOtherBytes() async throws {
        let device = try await TestDevice.make()
        var rng = SplitMix(state: 0xD47A_F00D)
        for (index, size) in [0, 1, 100, 4_000, 70_000].enumerated() {
            let url = device.url("f\(index)")
            let plaintext = randomData(size)
            try await device.files.write(plaintext, to: url, protection: .completeUntilFirstUserAuthentication)
            let original = [UInt8](try Data(contentsOf: url))
            for _ in 0..<400 {
                let mutated = Self.mutate(original, &rng)
                try Data(mutated).write(to: url)
                do {
                    let read = try await device.files.contents(of: url)
                    #expect(read == plaintext && mutated == original || ((try? device.files.protection(ofItemAt: url)) == .plain && read == Data(mutated)),
                            "seed state \(rng.state): a mutated file read as other bytes")
                } catch {
                    #expect(error is ProtectedFileError, "\(error)")
                }
            }
        }
    }
}
