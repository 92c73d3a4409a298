;;; emacs_defaults_e2e.el --- editors/emacs/diffill.el under Emacs + eglot defaults  -*- lexical-binding: t; -*-

;; emacs --batch -l emacs_defaults_e2e.el   with $DIFFILL_E2E_CONFIG = path of a JSON file:
;;   {plugin_dir, cmd, settings, file, result,
;;    ghost: {row, col, type},          typed right after eglot connects (model loading)
;;    trigger: {row, line, type}}       line replaced by `line', `type' typed at its end
;; Only what the harness needs is set (the server command, a synchronous connect); eglot's
;; and diffill's options keep their defaults (`diffill-inline-delay' too).  Records:
;; 1. `ghost': the one keystroke typed while the model loads gets ghost text by itself;
;; 2. `enter' / `typing': the trigger character, the ghost text shown, then RET or one more
;;    character: the lines after;
;; 3. `status': what M-x diffill-status shows (the *Messages* tail), and C-u M-x's buffer.
;; Every check is made by the pytest side.  Exit 0 = the run completed.

;;; Code:

;; The shared steps (config, result, finish, setup, connect): emacs_driver.el.
(load (expand-file-name "emacs_driver.el" (file-name-directory load-file-name)) nil t)

(defun e2e-wait (pred timeout)
  "Run timers and process output until PRED is non-nil or TIMEOUT seconds pass; PRED's value."
  (let ((deadline (+ (float-time) timeout)) v)
    (while (and (not (setq v (funcall pred))) (< (float-time) deadline))
      (accept-process-output nil 0.02))
    v))

(defun e2e-line (&optional n)
  (save-excursion
    (forward-line (or n 0))
    (buffer-substring-no-properties (line-beginning-position) (line-end-position))))

(defun e2e-trigger (name key)
  "Type the trigger character, wait for ghost text, then KEY; record under NAME."
  (let ((tr (e2e-get e2e-cfg 'trigger)))
    (erase-buffer)
    (insert e2e-original)
    (diffill-inline-dismiss)
    (goto-char (point-min))
    (forward-line (alist-get 'row tr))
    (delete-region (line-beginning-position) (line-end-position))
    (insert (alist-get 'line tr))
    (execute-kbd-macro (alist-get 'type tr))
    (let* ((shown (e2e-wait #'diffill-inline-suggestion 30))
           (line-shown (e2e-line)))
      (execute-kbd-macro (kbd key))
      (e2e-wait (lambda () nil) 0.5)     ; timers and answers after the key
      (forward-line (if (equal key "RET") -1 0))
      (e2e-put name `((shown . ,(or shown :json-false))
                      (line_shown . ,line-shown)
                      (lines . ,(vector (e2e-line) (e2e-line 1))))))))

(condition-case err
    (progn
      (e2e-setup)
      (e2e-connect)
      (e2e-put 'inline_mode (if diffill-inline-mode t :json-false))
      ;; 1) typed at once, while the server loads the model
      (let ((g (e2e-get e2e-cfg 'ghost)))
        (goto-char (point-min))
        (forward-line (alist-get 'row g))
        (forward-char (alist-get 'col g))
        (let ((st (diffill-status)) (t1 (e2e-ms)))
          (e2e-put 'loading_when_typed (if (and (eq (plist-get st :loading) t)
                                                (not (eq (plist-get st :loaded) t)))
                                           t :json-false))
          (execute-kbd-macro (alist-get 'type g))
          (let ((shown (e2e-wait #'diffill-inline-suggestion 30)))
            (e2e-put 'ghost `((shown . ,(or shown :json-false)) (ms . ,(- (e2e-ms) t1)))))))
      (e2e-wait (lambda () (eq (plist-get (diffill-status) :loaded) t)) 60)
      ;; 2) trigger character, then RET / one more character
      (e2e-trigger 'enter "RET")
      (e2e-trigger 'typing "x")
      ;; 3) M-x diffill-status, C-u M-x diffill-status
      (with-current-buffer (messages-buffer) (let ((inhibit-read-only t)) (erase-buffer)))
      (call-interactively #'diffill-status)
      (let ((summary (with-current-buffer (messages-buffer)
                       (string-trim (buffer-substring-no-properties (point-min) (point-max))))))
        (let ((current-prefix-arg '(4)))
          (call-interactively #'diffill-status))
        (e2e-put 'status `((summary . ,summary)
                           (raw . ,(diffill-status))
                           (full . ,(if (get-buffer "*diffill-status*")
                                        (with-current-buffer "*diffill-status*"
                                          (buffer-substring-no-properties (point-min) (point-max)))
                                      "")))))
      (set-buffer-modified-p nil)
      (e2e-finish t))
  (error (e2e-finish nil (format "%S" err))))

;;; emacs_defaults_e2e.el ends here
