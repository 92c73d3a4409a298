;;; emacs_e2e.el --- batch end-to-end run of editors/emacs/diffill.el  -*- lexical-binding: t; -*-

;; emacs --batch -l emacs_e2e.el   with $DIFFILL_E2E_CONFIG = path of a JSON file:
;;   {plugin_dir, cmd, settings, file, result, completion: {row, col}, ghost: {row, col, type}}
;; (0-based rows, character columns; at the ghost spot `type' is typed)
;; Writes a JSON result; every check is made by the pytest side.  Exit 0 = the run completed.

;;; Code:

;; The shared steps (config, result, finish, setup, connect): emacs_driver.el.
(load (expand-file-name "emacs_driver.el" (file-name-directory load-file-name)) nil t)

(defun e2e-wait (what pred &optional timeout explain)
  "Run timers and process output until PRED is non-nil; fail after TIMEOUT seconds.
EXPLAIN, if given, returns a string added to the failure message."
  (let ((deadline (+ (float-time) (or timeout 60))))
    (while (not (funcall pred))
      (when (> (float-time) deadline)
        (e2e-finish nil (format "timeout waiting for %s%s" what
                                (if explain (format " (%s)" (ignore-errors (funcall explain))) ""))))
      (accept-process-output nil 0.02))))

(defun e2e-goto (row col)
  (goto-char (point-min))
  (forward-line row)
  (forward-char (min col (- (line-end-position) (point)))))

(defun e2e-restore ()
  "Put the buffer back to the original document (sent to the server as a change)."
  (erase-buffer)
  (insert e2e-original)
  (diffill-inline-dismiss))

(defun e2e-line ()
  (buffer-substring-no-properties (line-beginning-position) (line-end-position)))

(condition-case err
    (progn
      (e2e-setup)
      (e2e-put 'emacs emacs-version)
      (e2e-put 'eglot (file-name-directory (locate-library "eglot")))
      (setq eglot-autoshutdown t
            diffill-inline-delay 0.05)
      (e2e-connect)
      (e2e-put 'connected_ms (e2e-ms))
      ;; The server loads the model after `initialized'; until then it answers with nothing.
      (e2e-wait "model loaded (diffill/status)"
                (lambda ()
                  (let ((st (diffill-status)))
                    (when (stringp (plist-get st :error))
                      (e2e-finish nil (format "model failed to load: %s" (plist-get st :error))))
                    (or (eq (plist-get st :loaded) t)
                        (progn (sleep-for 0.2) nil))))
                180)
      (e2e-put 'loaded_ms (e2e-ms))
      (e2e-put 'managed (if eglot--managed-mode t :json-false))
      (e2e-put 'inline_mode (if diffill-inline-mode t :json-false))

      ;; 1) completion-at-point (eglot's capf) inserts the server's completion.
      (let ((c (e2e-get e2e-cfg 'completion)))
        (e2e-goto (alist-get 'row c) (alist-get 'col c))
        (let ((raw (jsonrpc-request (eglot-current-server) :textDocument/completion
                                    (append (eglot--TextDocumentPositionParams)
                                            '(:context (:triggerKind 1)))))
              (line-before (e2e-line)))
          (when (seq-empty-p (plist-get raw :items))
            (e2e-finish nil "the server answered the completion request with no items"))
          (let ((capf (eglot-completion-at-point))
                (t1 (e2e-ms)))
            (e2e-put 'completion
                     `((line_before . ,line-before)
                       (raw . ,raw)
                       (candidates . ,(vconcat
                                       (mapcar #'substring-no-properties
                                               (all-completions
                                                (buffer-substring-no-properties (nth 0 capf) (point))
                                                (nth 2 capf)))))))
            (diffill-inline-dismiss)
            (completion-at-point)
            (e2e-put 'completion
                     (append (alist-get 'completion e2e-result)
                             `((line_after . ,(e2e-line))
                               (buffer_after . ,(buffer-substring-no-properties (point-min) (point-max)))
                               (ms . ,(- (e2e-ms) t1))))))
          (e2e-restore)))

      ;; 2) diffill-inline-mode: typing shows an overlay; TAB accepts it.
      (let ((answers 0)
            (g (e2e-get e2e-cfg 'ghost)))
        (add-hook 'diffill-inline-answer-functions (lambda (_items) (cl-incf answers)) nil t)
        (e2e-goto (alist-get 'row g) (alist-get 'col g))
        (diffill-inline-dismiss)
        (let ((line-before (e2e-line))
              (t1 (e2e-ms)))
          (execute-kbd-macro (alist-get 'type g)) ; self-insert-command, as if typed
          ;; The spot has a suggestion (the scripted checkpoint's): wait for it.
          (e2e-wait "ghost text" #'diffill-inline-suggestion 120
                    (lambda () (format "%d inline answers, line %S" answers (e2e-line))))
          (let* ((ov (cl-find-if (lambda (o) (overlay-get o 'diffill))
                                 (overlays-in (point-min) (point-max))))
                 (shown (substring-no-properties (overlay-get ov 'after-string)))
                 (raw (jsonrpc-request (eglot-current-server) :textDocument/inlineCompletion
                                       (append (eglot--TextDocumentPositionParams)
                                               '(:context (:triggerKind 2)))))
                 (before (buffer-substring-no-properties (point-min) (point-max)))
                 (point-before (1- (point))))
            (e2e-put 'ghost
                     `((ms . ,(- (e2e-ms) t1))
                       (line_before . ,line-before)
                       (line_typed . ,(e2e-line))
                       (overlay_at . ,(1- (overlay-start ov)))
                       (shown . ,shown)
                       (suggestion . ,(diffill-inline-suggestion))
                       (raw . ,raw)
                       (buffer_before_accept . ,before)
                       (point_before_accept . ,point-before)))
            (execute-kbd-macro (kbd "TAB"))
            (e2e-put 'ghost
                     (append (alist-get 'ghost e2e-result)
                             `((buffer_after_accept . ,(buffer-substring-no-properties (point-min) (point-max)))
                               (point_after_accept . ,(1- (point)))
                               (overlay_after_accept . ,(if (diffill-inline-visible-p) t :json-false))))))))
      (e2e-put 'status (diffill-status))
      ;; diffill-toggle pushes enabled=false with workspace/didChangeConfiguration.
      (diffill-toggle)
      (e2e-wait "toggle reaches the server"
                (lambda () (eq (plist-get (plist-get (diffill-status) :options) :enabled) :json-false))
                10)
      (e2e-put 'toggled_off t)
      (set-buffer-modified-p nil)
      (e2e-finish t))
  (error (e2e-finish nil (format "%S" err))))

;;; emacs_e2e.el ends here
