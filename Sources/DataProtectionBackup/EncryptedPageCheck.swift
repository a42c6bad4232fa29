import Foundation

/// Says that a file which is not a protected file is nonetheless ciphertext: an encrypted
/// database whose every page authenticates under a key the device keeps elsewhere (a
/// class-managed database's `-dpkey` file). Such a file is stored as it is, cut at its pages, so a
/// backup after a few pages changed stores those pages only (FORMAT.md §5.2). Each page stored
/// raw is checked first: one that does not authenticate makes the engine seal the whole file, as
/// it seals every plain file.
///
/// `DataProtectionSQLite`'s `DatabasePageCheck` makes one; the engine has none unless given a
/// recognizer (``BackupEngine/encryptedDatabases``), and then seals every plain file.
public struct EncryptedPageCheck: Sendable {
    /// The length of every page of the file.
    public var pageSize: Int
    /// Whether a page authenticates as page `number` (1-based) of the file.
    public var authenticates: @Sendable (_ page: UnsafeRawBufferPointer, _ number: Int) -> Bool

    public init(
        pageSize: Int, authenticates: @escaping @Sendable (_ page: UnsafeRawBufferPointer, _ number: Int) -> Bool
    ) {
        self.pageSize = pageSize
        self.authenticates = authenticates
    }
}

/// Finds the ``EncryptedPageCheck`` for a file, or `nil` when it is not an encrypted database
/// whose key is available now.
public typealias EncryptedDatabaseRecognizer = @Sendable (URL) async -> EncryptedPageCheck?
