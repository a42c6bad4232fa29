import DataProtection
import DataProtectionKeybag
import Foundation
import Logging
import Synchronization

/// Preferences in `UserDefaults`' shape, stored as a property list in a protected file of the
/// container's class (FORMAT.md §10.4): an app's own at `Library/Preferences/<ID>.plist`, a
/// group's at the group container's `Library/Preferences/<GROUP>.plist`.
///
/// ```swift
/// let defaults = ProtectedUserDefaults.standard                       // the app's own
/// defaults.set("dark", forKey: "theme")
/// let shared = ProtectedUserDefaults(suiteName: "group.com.example.notes")!
/// shared.set(3, forKey: "unread")
/// NotificationCenter.default.addObserver(forName: ProtectedUserDefaults.didChangeNotification, object: shared, queue: nil) { _ in … }
/// ```
///
/// Reads come from memory. Writes update memory at once and are written by a background worker
/// soon after (``synchronize()`` waits for it), atomically and key by key under a lock shared by
/// every process: two processes (two member apps of a group) setting different keys never lose
/// each other's updates. A change another process writes is read back and announced with
/// ``didChangeNotification`` (and on ``changes()``).
public final class ProtectedUserDefaults: Sendable {
    /// Posted (object: the defaults) when values changed — in this process or another.
    public static let didChangeNotification = Notification.Name("ProtectedUserDefaultsDidChangeNotification")

    /// Where the property list is.
    public let url: URL
    let store: PreferencesStore

    /// The app's own preferences (`Library/Preferences/<ID>.plist`). Outside an app (no
    /// ``CurrentApp``) they live in memory only, for this process.
    public static let standard: ProtectedUserDefaults = {
        if let app = CurrentApp.shared {
            return ProtectedUserDefaults(
                url: app.preferences.appendingPathComponent(app.identifier.rawValue + ".plist"), files: app.files)
        }
        return ProtectedUserDefaults(inMemory: ())
    }()

    /// `UserDefaults(suiteName:)`: `nil` (or the app's own identifier) gives the app's own
    /// preferences; an App Group's identifier gives the group's shared ones — `nil` when the app
    /// is not a member; any other name its own file in `Library/Preferences`. `nil` outside an app.
    public convenience init?(suiteName: String?) {
        guard let app = CurrentApp.shared else { return nil }
        guard let suiteName, suiteName != app.identifier.rawValue else {
            self.init(url: app.preferences.appendingPathComponent(app.identifier.rawValue + ".plist"), files: app.files)
            return
        }
        if suiteName.hasPrefix("group.") {
            guard let group = app.containerURL(forSecurityApplicationGroupIdentifier: suiteName) else { return nil }
            self.init(
                url: group.appendingPathComponent("Library/Preferences/" + suiteName + ".plist"), files: app.files)
            return
        }
        guard !suiteName.isEmpty, !suiteName.contains("/"), suiteName != ".", suiteName != ".." else { return nil }
        self.init(url: app.preferences.appendingPathComponent(suiteName + ".plist"), files: app.files)
    }

    /// The preferences in the property list at `url`, read and written with `files`' keys
    /// (tools outside an app: `dpctl defaults`).
    public convenience init(url: URL, files: ProtectedFileManager) {
        self.init(url: url, files: files, flushDelay: 1)
    }

    /// ``init(url:files:)`` with writes flushed `flushDelay` seconds after them at the latest
    /// (tests lengthen it to see the flush when the defaults go away), and with what is pending
    /// written when they go away waiting `finishingTimeLimit` seconds at most for the file's lock
    /// (tests shorten it).
    package init(url: URL, files: ProtectedFileManager, flushDelay: TimeInterval, finishingTimeLimit: TimeInterval = 5)
    {
        self.url = url
        self.store = PreferencesStore(
            url: url, files: files, flushDelay: flushDelay, finishingTimeLimit: finishingTimeLimit)
        store.owner = self
        store.start()
    }

    deinit { store.stop() }

    private init(inMemory: Void) {
        url = URL(fileURLWithPath: "/dev/null")
        store = PreferencesStore(url: nil, files: nil)
        store.owner = self
    }

    // MARK: - Reading

    public func object(forKey key: String) -> Any? { store.value(forKey: key) }
    public func string(forKey key: String) -> String? { object(forKey: key) as? String }
    public func data(forKey key: String) -> Data? { object(forKey: key) as? Data }
    public func array(forKey key: String) -> [Any]? { object(forKey: key) as? [Any] }
    public func stringArray(forKey key: String) -> [String]? { object(forKey: key) as? [String] }
    public func dictionary(forKey key: String) -> [String: Any]? { object(forKey: key) as? [String: Any] }
    public func url(forKey key: String) -> URL? {
        if let data = data(forKey: key) { return URL(dataRepresentation: data, relativeTo: nil) }
        return string(forKey: key).flatMap { URL(string: ($0 as NSString).expandingTildeInPath) }
    }
    /// `0` when absent; strings are converted as `UserDefaults` does.
    public func integer(forKey key: String) -> Int {
        switch object(forKey: key) {
        case let value as Int: value
        case let value as Double: Int(exactly: value.rounded(.towardZero)) ?? 0
        case let value as Bool: value ? 1 : 0
        case let value as String: Int(value) ?? Int(Double(value) ?? 0)
        default: 0
        }
    }
    public func double(forKey key: String) -> Double {
        switch object(forKey: key) {
        case let value as Double: value
        case let value as Int: Double(value)
        case let value as Bool: value ? 1 : 0
        case let value as String: Double(value) ?? 0
        default: 0
        }
    }
    public func float(forKey key: String) -> Float { Float(double(forKey: key)) }
    /// `true` for `true`, non-zero numbers and "YES"/"true"/"1" (as `UserDefaults`).
    public func bool(forKey key: String) -> Bool {
        switch object(forKey: key) {
        case let value as Bool: value
        case let value as Int: value != 0
        case let value as Double: value != 0
        case let value as String: ["yes", "true", "1"].contains(value.lowercased())
        default: false
        }
    }

    /// Every value, registered defaults included (stored values win).
    public func dictionaryRepresentation() -> [String: Any] { store.snapshot() }

    // MARK: - Writing

    /// Sets a property-list value (String, Data, Date, numbers, Bool, arrays and dictionaries of
    /// them); `nil` removes the key. A value a property list cannot hold is refused (logged,
    /// nothing stored) — use ``setValue(_:forKey:)`` to get the error.
    public func set(_ value: Any?, forKey key: String) {
        do { try setValue(value, forKey: key) } catch { store.logger.error("\(error)") }
    }
    public func set(_ value: Int, forKey key: String) { set(value as Any?, forKey: key) }
    public func set(_ value: Double, forKey key: String) { set(value as Any?, forKey: key) }
    public func set(_ value: Float, forKey key: String) { set(Double(value) as Any?, forKey: key) }
    public func set(_ value: Bool, forKey key: String) { set(value as Any?, forKey: key) }
    public func set(_ url: URL?, forKey key: String) { set(url?.absoluteString as Any?, forKey: key) }

    /// ``set(_:forKey:)``, throwing ``ContainerError/unsupportedPreferenceValue(key:type:)``.
    public func setValue(_ value: Any?, forKey key: String) throws {
        if let value {
            guard PropertyListSerialization.propertyList([key: value], isValidFor: .binary) else {
                throw ContainerError.unsupportedPreferenceValue(key: key, type: String(describing: type(of: value)))
            }
        }
        store.set(value, forKey: key)
    }

    public func removeObject(forKey key: String) { store.set(nil, forKey: key) }

    /// Values returned for keys that have none stored; never written.
    public func register(defaults: [String: Any]) { store.register(defaults) }

    /// Writes what is pending and reads back what others wrote; `false` when the file could not
    /// be read or written (its class unavailable while locked, say). Blocks this thread.
    @discardableResult
    public func synchronize() -> Bool { store.synchronize() }

    /// ``synchronize()``, throwing why the file could not be read or written (tools that must
    /// report it: `dpctl defaults`).
    public func synchronizeOrThrow() throws { try store.synchronizeOrThrow() }

    /// An async sequence that yields whenever values change (here or in another process).
    public func changes() -> AsyncStream<Void> { store.changes() }
}
