import Foundation

/// An object that shows a file to the user and wants to hear when another process — or another
/// coordinator in this one — changed, moved or deleted it: `NSFilePresenter`'s shape.
///
/// Register it with ``FileCoordinator/addFilePresenter(_:)`` and remove it with
/// ``FileCoordinator/removeFilePresenter(_:)``. As on Apple's systems, presenters hear only of
/// *coordinated* changes, and not of those made by a coordinator created with them
/// (`FileCoordinator(filePresenter: self)`). Across processes they hear after the fact: Apple's
/// `accommodatePresentedItemDeletion(completionHandler:)` asks before; here
/// ``presentedItemWasDeleted()`` tells after (FORMAT.md §10.5).
public protocol FilePresenter: AnyObject, Sendable {
    /// The item presented.
    var presentedItemURL: URL? { get }
    /// Its contents or attributes changed.
    func presentedItemDidChange()
    /// It was moved (renamed) to `newURL`.
    func presentedItemDidMove(to newURL: URL)
    /// It was deleted.
    func presentedItemWasDeleted()
}

extension FilePresenter {
    public func presentedItemDidChange() {}
    public func presentedItemDidMove(to newURL: URL) {}
    public func presentedItemWasDeleted() {}
}
