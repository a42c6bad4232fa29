import DataProtectionKeybag
import Foundation

extension Data {
    /// Writes protected, the way iOS code writes `data.write(to: url, options: .completeFileProtection)`.
    ///
    /// ```swift
    /// try await data.write(to: url, options: [.atomic, .completeFileProtection], using: files)
    /// ```
    /// Writes are always atomic.
    public func write(to url: URL, options: Data.WritingOptions = [], using files: ProtectedFileManager) async throws {
        try await files.write(self, to: url, options: options)
    }

    /// Reads a protected (or plain) file, like `Data(contentsOf:)`.
    public init(contentsOfProtectedFile url: URL, using files: ProtectedFileManager) async throws {
        self = try await files.contents(of: url)
    }
}
