import DataProtectionKeybag
import Foundation

/// What a path holds, as far as protection goes — readable without any key.
public enum ItemProtection: Sendable, Equatable {
    /// A directory, with its default class for new files if it has one.
    case directory(defaultClass: ProtectionClass?)
    /// A file in the protected format, with its class (from the header, not yet authenticated).
    case protected(ProtectionClass)
    /// A plain file: not protected. Protecting it converts it in place.
    case plain
    /// Something else (a device, a socket …).
    case other

    /// The class a file carries, `nil` for plain files and directories.
    public var fileClass: ProtectionClass? {
        if case .protected(let cls) = self { return cls }
        return nil
    }
}

/// Directory defaults, kept in the extended attribute `user.dataprotection.class`.
enum DirectoryDefault {
    static let attribute = "user.dataprotection.class"

    static func get(_ directory: String) throws -> ProtectionClass? {
        guard let value = try POSIXFile.getAttribute(attribute, path: directory) else { return nil }
        return ProtectionClass(name: String(decoding: value, as: UTF8.self))
    }

    static func set(_ cls: ProtectionClass?, _ directory: String) throws {
        if let cls {
            try POSIXFile.setAttribute(attribute, Array(cls.cliName.utf8), path: directory)
        } else {
            try POSIXFile.removeAttribute(attribute, path: directory)
        }
    }

    /// The default of the nearest ancestor of `path` that has one (unreadable ancestors are skipped).
    static func inherited(forNewItemAt path: String) -> ProtectionClass? {
        var directory = URL(fileURLWithPath: path).standardizedFileURL.deletingLastPathComponent()
        while true {
            if let cls = try? get(directory.path) { return cls }
            if directory.path == "/" { return nil }
            directory = directory.deletingLastPathComponent()
        }
    }
}
